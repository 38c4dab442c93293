"""Review of session 7's changes: the eager ``_EagerFunction`` path of the Triton FlashMask attention (vs the
``torch.library`` custom ops) and the flex backend's BlockMask cache under ``torch.compile``.

CPU, Triton interpreter (``TRITON_INTERPRET=1``), tiny shapes.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from flashmask.triton_flashmask import flashmask_attention_triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("eager_op", ["0", "1"], ids=["autograd-function", "custom-op"])
def test_double_backward_raises_on_both_paths(monkeypatch, eager_op):
    """The backward kernels are not differentiable. The custom op raises when a second backward reaches them;
    the eager autograd.Function returned gradients without a graph, so with ``create_graph=True`` a second-order
    loss that also has other terms (a gradient penalty plus a weight term) silently dropped the attention's
    part. Both paths must raise."""
    monkeypatch.setenv("FLASHMASK_EAGER_OP", eager_op)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 16, generator=g).to(DEV).requires_grad_() for _ in range(3))
    w = torch.randn(3, device=DEV, requires_grad=True)
    out, _ = flashmask_attention_triton(q, k, v, None, True, 0.25)
    dq, = torch.autograd.grad(out.square().sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError):
        ((dq ** 2).sum() + (w ** 2).sum()).backward()
