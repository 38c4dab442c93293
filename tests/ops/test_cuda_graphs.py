"""GPU only: the Triton attention inside CUDA graphs (``torch.compile(mode="reduce-overhead")``).

The mask preprocessing is cached in Python (on the index tensor, and ``_NO_MASK`` for calls without one), and a
graph replay runs no Python: these check that a replay with a new mask in the same static input still uses that
mask, and that a captured no-mask graph survives ``_NO_MASK`` being cleared (33 other lengths) afterwards.
"""

from __future__ import annotations

import pytest
import torch

from flashmask import flashmask_attention
from flashmask import masks as M
from flashmask.reference import flashmask_attention_reference

pytestmark = pytest.mark.gpu


def _qkv(s, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(1, s, 4, 64, generator=g, device="cuda", dtype=torch.float16) for _ in range(3)]


def test_reduce_overhead_follows_the_mask_of_each_call():
    fn = torch.compile(lambda q, k, v, sri: flashmask_attention(q, k, v, sri, causal=True, impl="triton") * 1.0,
                       mode="reduce-overhead")
    q, k, v = _qkv(256, 0)
    masks = [M.causal_document_mask([lens]).startend_row_indices.cuda() for lens in ([100, 156], [30, 200, 26])]
    for _ in range(3):
        for sri in masks:
            want, _ = flashmask_attention_reference(q, k, v, sri, True, 64 ** -0.5)
            torch.testing.assert_close(fn(q, k, v, sri), want, atol=2e-3, rtol=2e-3)


def test_reduce_overhead_no_mask_survives_cache_clear():
    fn = torch.compile(lambda q, k, v: flashmask_attention(q, k, v, None, causal=True, impl="triton") * 1.0,
                       mode="reduce-overhead")
    q, k, v = _qkv(128, 1)
    want, _ = flashmask_attention_reference(q, k, v, None, True, 64 ** -0.5)
    for _ in range(3):
        torch.testing.assert_close(fn(q, k, v), want, atol=2e-3, rtol=2e-3)
    for s in range(16, 16 + 33):  # 33 other lengths, eager: clears the module-level no-mask cache
        a = _qkv(s, s)
        flashmask_attention(*a, None, causal=True, impl="triton")
        torch.cuda.empty_cache()
    junk = torch.randn(64 << 20, device="cuda")  # reuse freed memory
    del junk
    for _ in range(2):
        torch.testing.assert_close(fn(q, k, v), want, atol=2e-3, rtol=2e-3)
