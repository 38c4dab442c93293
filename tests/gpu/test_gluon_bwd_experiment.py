"""The first, experimental Gluon backward (flashmask.experimental, Hopper only) against the fp32 reference.

Same tolerance rule as the Triton kernels' GPU tests (tests/ops/tolerance.py: 2x the error of a same-dtype
PyTorch run plus a floor); no mask and causal, two variants (operands through shared memory / registers).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from tolerance import assert_close_to_ref  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", [{}, {"SMEM_OPERANDS": False}, {"ACC_INIT": True, "NDQ": 1},
                                     {"NS": 3, "NDQ": 1, "SPLIT_WORKER": True, "VEC_RED": True}])
def test_gluon_backward_matches_reference(causal, variant):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel is written for Hopper (sm_90)")
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from test_flashmask_gpu import chunked_reference

    from flashmask import triton_flashmask as tf
    from flashmask.experimental import gluon_backward

    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, do = (torch.randn(2, 1024, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(4))
    scale = 128 ** -0.5
    o, lse = tf._attention_fwd(q, k, v, None, causal, scale)
    got = gluon_backward(do, q, k, v, o, lse, scale, causal, **variant)
    ref = chunked_reference(q, k, v, do, None, causal, scale, torch.float32)
    same = chunked_reference(q, k, v, do, None, causal, scale, torch.bfloat16)
    for name, g, r, t in zip(("dq", "dk", "dv"), got, ref[2:], same[2:]):
        assert_close_to_ref(g, r, t, name, dtype=torch.bfloat16)


def test_gluon_backward_rejects_out_of_scope_shapes():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from flashmask.experimental import gluon_backward

    x = torch.zeros(1, 256, 2, 64, device="cuda", dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 256, device="cuda")
    with pytest.raises(ValueError, match="head dim must be 128"):
        gluon_backward(x, x, x, x, x, lse, 0.125, False)
