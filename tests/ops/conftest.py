"""Op-test fixtures: NaN-poisoned allocations.

Inside every test of ``tests/ops`` ``torch.empty`` / ``torch.empty_like`` return floating tensors filled
with NaN (signed integer tensors with their most negative value, unsigned ones with their largest), so a kernel that leaves part of its output unwritten fails the
comparison instead of passing on lucky zeros ("poison the output").
"""

import pytest
import torch
from torch.utils._device import _device_constructors

def _poison(t: torch.Tensor) -> torch.Tensor:
    # torch.compile's own allocations (fake tensors, e.g. inductor's pad_mm probes with requires_grad=True)
    # cannot be filled in place and are not kernel outputs: left alone
    if t.requires_grad or isinstance(t, torch._subclasses.FakeTensor):
        return t
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype != torch.bool and t.numel():
        info = torch.iinfo(t.dtype)
        t.fill_(info.min if info.min < 0 else info.max)
    return t


# torch.device(...) contexts recognise factory functions by identity through an lru_cached set; fill it with the
# real torch.empty now, so a first use during a poisoned test (e.g. while torch.compile traces) cannot cache the
# wrapper and make later `with torch.device("meta")` blocks, in other test files, ignore torch.empty.
_device_constructors()


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
