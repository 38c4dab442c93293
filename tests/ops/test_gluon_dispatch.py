"""Which backward / forward runs (``triton_flashmask.gluon_bwd_eligible`` / ``gluon_fwd_eligible``) and the
fallback to the Triton kernels, on CPU.

The Gluon kernel itself needs an sm_90 GPU (tests/gpu/test_gluon_gpu.py); here its launcher is replaced by
one that raises, to check that ``FLASHMASK_BWD=auto`` warns once and finishes on the Triton kernels with the
right gradients (and stays there), that out of memory falls back for one call only, and that
``FLASHMASK_BWD=gluon`` raises instead.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from flashmask import triton_flashmask as tf  # noqa: E402


def _grads(seed=0):
    """fp32 gradients of a small causal call: on the GPU where there is one (the Triton kernels do not take CPU
    tensors outside the interpreter), else on the CPU under ``TRITON_INTERPRET``."""
    g = torch.Generator().manual_seed(seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, do = (torch.randn(1, 64, 2, 32, generator=g).to(dev) for _ in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = tf.flashmask_attention_triton(q, k, v, None, True, 32 ** -0.5, False)[0]
    return torch.autograd.grad(out, (q, k, v), do)


def test_not_eligible_on_cpu_or_when_deterministic(monkeypatch):
    q = torch.zeros(1, 128, 2, 128, dtype=torch.bfloat16)
    monkeypatch.setenv("FLASHMASK_BWD", "auto")
    assert not tf.gluon_bwd_eligible(q, q, q, q, deterministic=False)  # not a CUDA tensor
    assert not tf.gluon_bwd_eligible(q, q, q, q, deterministic=True)


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FLASHMASK_BWD", "cuda")
    with pytest.raises(ValueError, match="FLASHMASK_BWD"):
        tf.gluon_bwd_eligible(torch.zeros(1, 128, 2, 128), torch.zeros(1, 128, 2, 128),
                              torch.zeros(1, 128, 2, 128), torch.zeros(1, 128, 2, 128), deterministic=False)


def _broken_gluon(monkeypatch, exc, which="bwd"):
    """The Gluon ``which`` (``fwd`` / ``bwd``) is eligible whenever it has not failed before, and its launcher
    raises ``exc``. Returns the list of its calls."""
    module = pytest.importorskip(f"flashmask.gluon_{which}")  # a Triton with Gluon (3.5+)
    failed = "_GLUON_FWD_FAILED" if which == "fwd" else "_GLUON_FAILED"
    calls = []

    def boom(*args, **kwargs):
        calls.append(1)
        raise exc

    monkeypatch.setattr(tf, f"gluon_{which}_eligible", lambda *a, **k: not getattr(tf, failed))
    monkeypatch.setattr(module, "launch", boom)
    monkeypatch.setattr(tf, failed, [])
    return calls


def test_auto_falls_back_to_triton_once(monkeypatch):
    monkeypatch.setenv("FLASHMASK_BWD", "triton")
    want = _grads()
    monkeypatch.setenv("FLASHMASK_BWD", "auto")
    calls = _broken_gluon(monkeypatch, RuntimeError("no Gluon here"))
    with pytest.warns(RuntimeWarning, match="Gluon backward failed.*no Gluon here"):
        got = _grads()
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert tf._GLUON_FAILED == ["RuntimeError: no Gluon here"]  # a string: no frames or tensors kept alive
    again = _grads()  # the Triton kernels from now on, without trying Gluon again
    assert len(calls) == 1
    for a, b in zip(again, want):
        assert torch.equal(a, b)


def test_out_of_memory_falls_back_for_that_call_only(monkeypatch):
    monkeypatch.setenv("FLASHMASK_BWD", "auto")
    calls = _broken_gluon(monkeypatch, torch.OutOfMemoryError("CUDA out of memory"))
    _grads()
    _grads()
    assert len(calls) == 2 and tf._GLUON_FAILED == []


def test_forced_gluon_raises(monkeypatch):
    monkeypatch.setenv("FLASHMASK_BWD", "gluon")
    _broken_gluon(monkeypatch, RuntimeError("no Gluon here"))
    with pytest.raises(RuntimeError, match="no Gluon here"):
        _grads()


def _out(seed=0):
    g = torch.Generator().manual_seed(seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(1, 64, 2, 32, generator=g).to(dev) for _ in range(3))
    return tf.flashmask_attention_triton(q, k, v, None, True, 32 ** -0.5, False)


def test_forward_dispatch(monkeypatch):
    """The Gluon forward: not on CPU tensors; a bad FLASHMASK_FWD names itself; a failing launcher warns once and
    the Triton forward gives the same output from then on; out of memory falls back for one call; ``gluon``
    raises."""
    q = torch.zeros(1, 128, 2, 128, dtype=torch.bfloat16)
    monkeypatch.delenv("FLASHMASK_FWD", raising=False)
    monkeypatch.setattr(tf, "_hopper_gluon_shape", lambda *a: True)  # as if on an H100 / H200
    assert tf.gluon_fwd_eligible(q, q, q)  # the default is auto
    monkeypatch.setenv("FLASHMASK_FWD", "triton")
    assert not tf.gluon_fwd_eligible(q, q, q)
    monkeypatch.undo()
    monkeypatch.setenv("FLASHMASK_FWD", "auto")
    assert not tf.gluon_fwd_eligible(q, q, q)  # not a CUDA tensor
    monkeypatch.setenv("FLASHMASK_FWD", "cuda")
    with pytest.raises(ValueError, match="FLASHMASK_FWD"):
        tf.gluon_fwd_eligible(q, q, q)
    monkeypatch.setenv("FLASHMASK_FWD", "triton")
    want = _out()
    monkeypatch.setenv("FLASHMASK_FWD", "auto")
    calls = _broken_gluon(monkeypatch, RuntimeError("no Gluon here"), "fwd")
    with pytest.warns(RuntimeWarning, match="Gluon forward failed.*no Gluon here"):
        got = _out()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert tf._GLUON_FWD_FAILED == ["RuntimeError: no Gluon here"] and tf._GLUON_FAILED == []
    _out()
    assert len(calls) == 1
    calls = _broken_gluon(monkeypatch, torch.OutOfMemoryError("CUDA out of memory"), "fwd")
    _out()
    _out()
    assert len(calls) == 2 and tf._GLUON_FWD_FAILED == []
    monkeypatch.setenv("FLASHMASK_FWD", "gluon")
    _broken_gluon(monkeypatch, RuntimeError("no Gluon here"), "fwd")
    with pytest.raises(RuntimeError, match="no Gluon here"):
        _out()


@pytest.mark.parametrize("shape,dtype,rows,cols,block", [
    ((2, 256, 4, 128), torch.bfloat16, 512, 512, [64, 128]),  # q / dO: [B*S, H*D], [BLOCK_M, D] boxes
    ((2, 256, 2, 128), torch.float16, 512, 256, [64, 128]),  # dk / dv boxes of the GQA case
    ((8, 256, 128), torch.float32, 2048, 128, [64, 128]),  # the fp32 dQ accumulator
    ((2, 4, 256), torch.float32, 32, 64, [1, 64]),  # LSE / Delta rows
])
def test_tensor_desc_matches_from_tensor(shape, dtype, rows, cols, block):
    """The launcher's cached-layout descriptor describes the same memory, box and layout as Gluon's own
    ``TensorDescriptor.from_tensor`` over a view (the slower form it replaced), and refuses a strided tensor."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from flashmask import gluon_bwd

    t = torch.zeros(shape, dtype=dtype)
    got = gluon_bwd.tensor_desc(t, rows, cols, block)
    dt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
    ref = TensorDescriptor.from_tensor(t.view(rows, cols), block, gl.NVMMASharedLayout.get_default_for(block, dt))
    assert got.base.data_ptr() == ref.base.data_ptr()
    assert (list(got.shape), list(got.strides), list(got.block_shape)) == (list(ref.shape), list(ref.strides),
                                                                          list(ref.block_shape))
    assert got.layout == ref.layout
    with pytest.raises(ValueError, match="contiguous"):
        gluon_bwd.tensor_desc(t.transpose(0, 1), rows, cols, block)


def test_tensor_desc_refuses_a_wrong_element_count():
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from flashmask import gluon_bwd

    with pytest.raises(ValueError, match="64 x 128 elements"):
        gluon_bwd.tensor_desc(torch.zeros(32, 128), 64, 128, [64, 128])


def test_import_failure_falls_back_to_triton(monkeypatch):
    """A Triton whose Gluon lacks what ``gluon_bwd`` imports warns once and runs the Triton kernels."""
    import sys

    import flashmask

    monkeypatch.setenv("FLASHMASK_BWD", "triton")
    want = _grads()
    monkeypatch.setenv("FLASHMASK_BWD", "auto")
    monkeypatch.setattr(tf, "gluon_bwd_eligible", lambda *a, **k: not tf._GLUON_FAILED)
    monkeypatch.setattr(tf, "_GLUON_FAILED", [])
    monkeypatch.delattr(flashmask, "gluon_bwd", raising=False)
    monkeypatch.setitem(sys.modules, "flashmask.gluon_bwd", None)  # the import raises ModuleNotFoundError
    with pytest.warns(RuntimeWarning, match="Gluon backward failed.*ModuleNotFoundError"):
        got = _grads()
    for a, b in zip(got, want):
        assert torch.equal(a, b)
