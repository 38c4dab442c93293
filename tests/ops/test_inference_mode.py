"""Attention under ``torch.inference_mode()`` (generation): the per-tensor caches (index range check, Triton mask
preprocessing, FlexAttention BlockMask) were keyed on ``sri._version``, which an inference tensor does not have
("RuntimeError: Inference tensors do not track version counter"). Inference tensors are not cached."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from flashmask import flashmask_attention  # noqa: E402
from flashmask import masks as M  # noqa: E402
from flashmask.flex import flex_flashmask_attention  # noqa: E402
from flashmask.reference import flashmask_attention_reference  # noqa: E402
from test_triton import DEV, make_qkv  # noqa: E402


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_inference_mode_index_tensor(impl):
    q, k, v, _ = make_qkv(1, 24, 24, 2, 1, 16, torch.float32, seed=3)
    sri_grad = M.causal_document_mask([[10, 14]]).startend_row_indices.to(DEV)
    want, _ = flashmask_attention_reference(q, k, v, sri_grad, True, 0.25)
    with torch.inference_mode():
        sri = M.causal_document_mask([[10, 14]]).startend_row_indices.to(DEV)
        assert sri.is_inference()
        for _ in range(2):  # a second layer with the same tensor
            out = flashmask_attention(q, k, v, sri, causal=True, softmax_scale=0.25, impl=impl)
            torch.testing.assert_close(out, want)
        sri[..., 0] = 24  # in place inside inference mode (no version counter): now plain causal
        out = flashmask_attention(q, k, v, sri, causal=True, softmax_scale=0.25, impl=impl)
        torch.testing.assert_close(out, flashmask_attention_reference(q, k, v, None, True, 0.25)[0])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_inference_mode_flex():
    q, k, v, _ = make_qkv(1, 24, 24, 2, 1, 16, torch.float32, seed=3)
    with torch.inference_mode():
        sri = M.causal_document_mask([[10, 14]]).startend_row_indices.to(DEV)
        out = flex_flashmask_attention(q, k, v, sri, causal=True, softmax_scale=0.25)
        want, _ = flashmask_attention_reference(q, k, v, sri, True, 0.25)
        torch.testing.assert_close(out, want)
