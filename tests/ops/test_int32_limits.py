"""The Triton kernels index with int32 arithmetic (program id times an int32 stride / list length): sizes whose
offsets pass 2**31 - 1 would wrap around (out-of-bounds reads and writes on the GPU), so they are a clear
ValueError before any allocation or launch. Checked with meta tensors / bare sizes: nothing large is allocated."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from flashmask import triton_blocklists as tl_lists  # noqa: E402
from flashmask.autograd import flashmask_attention_triton  # noqa: E402


def test_qkv_offsets_over_int32_are_refused():
    # B*S*H*D = 5 * 131072 * 32 * 128 > 2**31 elements: b * stride(0) overflows int32 in the kernels
    q = torch.empty(5, 131072, 32, 128, dtype=torch.float16, device="meta")
    k = torch.empty(5, 131072, 8, 128, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match=r"q \(5, 131072, 32, 128\).*2\*\*31"):
        flashmask_attention_triton(q, k, k, None, True, 0.1)
    # exactly 2**31 elements: the largest offset is 2**31 - 1, still an int32 (meta tensors: the fake kernel runs)
    q, k = q[:4], k[:4]
    out, lse = flashmask_attention_triton(q, k, k, None, True, 0.1)
    assert out.shape == q.shape and lse.shape == (4, 32, 131072)


def test_visit_list_over_int32_is_refused():
    # 129 mask rows x 4096 x 4096 blocks of 16 > 2**31 list entries: row * T overflows int32 in the kernels
    mm = torch.zeros(8, 1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"2164260864 entries"):
        tl_lists.block_lists(mm, 129, 65536, 65536, 16, 16, False, True, True, False, False, False)

