"""Op-test fixtures: NaN-poisoned allocations.

Inside every test of ``tests/ops`` ``torch.empty`` / ``torch.empty_like`` return floating tensors filled
with NaN (integer tensors with -7777), so a kernel that leaves part of its output unwritten fails the
comparison instead of passing on lucky zeros (METHOD.md: "poison the output").
"""

import pytest
import torch

_INT_POISON = -7777


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype != torch.bool and t.numel():
        t.fill_(_INT_POISON)
    return t


@pytest.fixture(autouse=True)
def nan_poison(monkeypatch):
    """Make ``torch.empty`` / ``torch.empty_like`` return poisoned tensors for the duration of the test."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def empty(*args, **kwargs):
        return _poison(real_empty(*args, **kwargs))

    def empty_like(*args, **kwargs):
        return _poison(real_empty_like(*args, **kwargs))

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch, "empty_like", empty_like)
    yield
