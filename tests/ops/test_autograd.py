"""The two autograd paths of ``flashmask_attention_triton`` (the eager ``autograd.Function`` and the
``torch.library`` custom ops): both are first order.

CPU, Triton interpreter (``TRITON_INTERPRET=1``), tiny shapes.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

import flashmask.autograd as fm_autograd  # noqa: E402
from flashmask.autograd import flashmask_attention_triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("custom_op", [False, True], ids=["autograd-function", "custom-op"])
def test_double_backward_raises_on_both_paths(monkeypatch, custom_op):
    """The backward kernels are not differentiable. A second backward through either path raises, so a
    second-order loss that also has other terms (a gradient penalty plus a weight term) cannot silently drop the
    attention's part."""
    monkeypatch.setattr(fm_autograd, "_use_custom_op", lambda *tensors: custom_op)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 16, generator=g).to(DEV).requires_grad_() for _ in range(3))
    w = torch.randn(3, device=DEV, requires_grad=True)
    out, _ = flashmask_attention_triton(q, k, v, None, True, 0.25)
    dq, = torch.autograd.grad(out.square().sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError):
        ((dq ** 2).sum() + (w ** 2).sum()).backward()
