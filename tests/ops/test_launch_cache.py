"""``launch_cache.launch``: the first launch of a specialisation goes through ``kernel[grid]``; later ones call the
kept compiled kernel with every parameter in signature order; anything Triton specialises on changes the key."""

import pytest
import torch

from flashmask import launch_cache


class _Compiled:
    packed_metadata = object()
    function = 7

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, leave, *args):
        self.runs.append(((g0, g1, g2), args))


class _Kernel:
    """Stands in for a ``JITFunction`` of ``(X, n, scale, BLOCK: constexpr, FLAG: constexpr)``."""
    arg_names = ["X", "n", "scale", "BLOCK", "FLAG"]

    def __init__(self):
        self.slow = []
        self.compiled = _Compiled()

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.slow.append((grid, args, kwargs))
            return self.compiled
        return call


@pytest.fixture(autouse=True)
def _fresh():
    launch_cache.clear()
    yield
    launch_cache.clear()


def _direct_launches_on_gpu_only(monkeypatch):
    """As on a GPU: compiled kernels (the suite sets TRITON_INTERPRET=1 on CPU machines), device 0."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launch_cache, "_device_and_stream", lambda: (0, 0))


def test_second_launch_calls_the_compiled_kernel_with_constexprs_in_signature_order(monkeypatch):
    _direct_launches_on_gpu_only(monkeypatch)
    k, x = _Kernel(), torch.zeros(64)
    launch_cache.launch(k, (3,), x, 32, 0.5, FLAG=True, BLOCK=64, num_warps=4)
    launch_cache.launch(k, (3,), x, 32, 0.25, FLAG=True, BLOCK=64, num_warps=4)
    assert len(k.slow) == 1
    assert k.compiled.runs == [((3, 1, 1), (x, 32, 0.25, 64, True))]


@pytest.mark.parametrize("change", ["int value", "constexpr", "option", "grid", "dtype", "alignment", "bool for 1"])
def test_a_changed_specialisation_goes_through_triton(monkeypatch, change):
    _direct_launches_on_gpu_only(monkeypatch)
    k, x = _Kernel(), torch.zeros(64)
    args, kw, grid = [x, 32, 0.5], dict(BLOCK=64, FLAG=True, num_warps=4), (3,)
    launch_cache.launch(k, grid, *args, **kw)
    if change == "int value":
        args[1] = 48
    elif change == "constexpr":
        kw["BLOCK"] = 128
    elif change == "option":
        kw["num_warps"] = 8
    elif change == "grid":
        grid = (4,)
    elif change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.float16)
    elif change == "alignment":
        args[0] = torch.zeros(65)[1:]  # 4 bytes past a 16-byte boundary
    else:
        args[1], k0 = 1, _Kernel()
        launch_cache.launch(k0, grid, x, 1, 0.5, **kw)
        launch_cache.launch(k0, grid, x, True, 0.5, **kw)
        assert len(k0.slow) == 2
        return
    launch_cache.launch(k, grid, *args, **kw)
    assert len(k.slow) == 2 and k.compiled.runs == []


def test_a_missing_constexpr_keyword_is_never_kept(monkeypatch):
    """A parameter left to its default cannot be placed in the direct call: every launch goes through Triton."""
    _direct_launches_on_gpu_only(monkeypatch)
    k, x = _Kernel(), torch.zeros(64)
    for _ in range(2):
        launch_cache.launch(k, (1,), x, 32, 0.5, BLOCK=64)
    assert len(k.slow) == 2


def test_another_device_goes_through_triton(monkeypatch):
    """A compiled kernel's function handle belongs to the device it was loaded on."""
    _direct_launches_on_gpu_only(monkeypatch)
    k, x = _Kernel(), torch.zeros(64)
    for device in (0, 1):
        monkeypatch.setattr(launch_cache, "_device_and_stream", lambda d=device: (d, 0))
        launch_cache.launch(k, (1,), x, 32, 0.5, BLOCK=64, FLAG=False)
    assert len(k.slow) == 2 and k.compiled.runs == []


def test_the_interpreter_is_called_every_time(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    k, x = _Kernel(), torch.zeros(64)
    for _ in range(2):
        launch_cache.launch(k, (1,), x, 32, 0.5, BLOCK=64, FLAG=False)
    assert len(k.slow) == 2 and k.compiled.runs == []
