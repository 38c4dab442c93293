"""Which backward / forward runs (``dispatch.gluon_bwd_eligible`` / ``gluon_fwd_eligible``), the Triton version
gate of the Gluon kernels and the fallback to the Triton kernels, on CPU.

The Gluon kernel itself needs an sm_90 GPU (tests/gpu/test_gluon_gpu.py); here its launcher is replaced by
one that raises, to check that ``FLASHMASK_BWD=auto`` warns once and finishes on the Triton kernels with the
right gradients (and stays there), that out of memory falls back for one call only, and that
``FLASHMASK_BWD=gluon`` raises instead; and the gate is given a Triton release it was not built for, or a Gluon
API that does not import, to check that the Triton kernels run with a single warning.
"""

from __future__ import annotations

import os
import re
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from flashmask import dispatch as tf  # noqa: E402
from flashmask.autograd import flashmask_attention_triton  # noqa: E402


def _grads(seed=0):
    """fp32 gradients of a small causal call: on the GPU where there is one (the Triton kernels do not take CPU
    tensors outside the interpreter), else on the CPU under ``TRITON_INTERPRET``."""
    g = torch.Generator().manual_seed(seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, do = (torch.randn(1, 64, 2, 32, generator=g).to(dev) for _ in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = flashmask_attention_triton(q, k, v, None, True, 32 ** -0.5, False)[0]
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
    failed = "forward" if which == "fwd" else "backward"
    calls = []

    def boom(*args, **kwargs):
        calls.append(1)
        raise exc

    monkeypatch.setattr(tf, f"gluon_{which}_eligible", lambda *a, **k: not tf._FAILED[failed])
    monkeypatch.setattr(module, "launch", boom)
    monkeypatch.setitem(tf._FAILED, failed, [])
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
    assert tf._FAILED["backward"] == ["RuntimeError: no Gluon here"]  # a string: no frames or tensors kept alive
    again = _grads()  # the Triton kernels from now on, without trying Gluon again
    assert len(calls) == 1
    for a, b in zip(again, want):
        assert torch.equal(a, b)


def test_out_of_memory_falls_back_for_that_call_only(monkeypatch):
    monkeypatch.setenv("FLASHMASK_BWD", "auto")
    calls = _broken_gluon(monkeypatch, torch.OutOfMemoryError("CUDA out of memory"))
    _grads()
    _grads()
    assert len(calls) == 2 and tf._FAILED["backward"] == []


def test_forced_gluon_raises(monkeypatch):
    monkeypatch.setenv("FLASHMASK_BWD", "gluon")
    _broken_gluon(monkeypatch, RuntimeError("no Gluon here"))
    with pytest.raises(RuntimeError, match="no Gluon here"):
        _grads()


def _out(seed=0):
    g = torch.Generator().manual_seed(seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(1, 64, 2, 32, generator=g).to(dev) for _ in range(3))
    return flashmask_attention_triton(q, k, v, None, True, 32 ** -0.5, False)


def test_forward_dispatch(monkeypatch):
    """The Gluon forward: not on CPU tensors; a bad FLASHMASK_FWD names itself; a failing launcher warns once and
    the Triton forward gives the same output from then on; out of memory falls back for one call; ``gluon``
    raises."""
    q = torch.zeros(1, 128, 2, 128, dtype=torch.bfloat16)
    monkeypatch.delenv("FLASHMASK_FWD", raising=False)
    monkeypatch.setattr(tf, "_hopper_gluon_shape", lambda *a: True)  # as if on an H100 / H200
    monkeypatch.setattr(tf, "_GATE", [""])  # on a Triton the Gluon kernels were built for
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
    assert tf._FAILED["forward"] == ["RuntimeError: no Gluon here"] and tf._FAILED["backward"] == []
    _out()
    assert len(calls) == 1
    calls = _broken_gluon(monkeypatch, torch.OutOfMemoryError("CUDA out of memory"), "fwd")
    _out()
    _out()
    assert len(calls) == 2 and tf._FAILED["forward"] == []
    monkeypatch.setenv("FLASHMASK_FWD", "gluon")
    _broken_gluon(monkeypatch, RuntimeError("no Gluon here"), "fwd")
    with pytest.raises(RuntimeError, match="no Gluon here"):
        _out()


@pytest.mark.parametrize("shape,dtype,rows,cols,block,swizzle", [
    ((2, 256, 4, 128), torch.bfloat16, 512, 512, [64, 128], True),  # q / dO: [B*S, H*D], [BLOCK_M, D] boxes
    ((2, 256, 2, 128), torch.float16, 512, 256, [64, 128], True),  # dk / dv boxes of the GQA case
    ((2, 256, 4, 128), torch.float32, 1024, 256, [16, 256], False),  # the fp32 dQ tiles: one unswizzled box each
    ((2, 256, 4, 64), torch.float32, 512, 256, [16, 256], False),  # the same at D = 64
    ((2, 4, 256), torch.float32, 32, 64, [1, 64], True),  # LSE / Delta rows
])
def test_tensor_desc_matches_from_tensor(shape, dtype, rows, cols, block, swizzle):
    """The launcher's descriptors (the first of a geometry validated by Triton, the next ones copies with another
    base) describe the same memory, box and layout as Gluon's own ``TensorDescriptor.from_tensor`` over a view (a
    slower way to build them), and a strided tensor is refused."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from flashmask import gluon_bwd, launch_cache

    dt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
    first, second = torch.zeros(shape, dtype=dtype), torch.ones(shape, dtype=dtype)
    for t in (first, second):  # the second one copies the validated fields of the first
        got = gluon_bwd.tensor_desc(t, rows, cols, block, swizzle=swizzle)
        layout = (gl.NVMMASharedLayout.get_default_for(block, dt) if swizzle else
                  gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=dt.primitive_bitwidth, rank=2))
        ref = TensorDescriptor.from_tensor(t.view(rows, cols), block, layout)
        assert got.base is t and got.base.data_ptr() == ref.base.data_ptr()
        assert (list(got.shape), list(got.strides), list(got.block_shape)) == (list(ref.shape), list(ref.strides),
                                                                              list(ref.block_shape))
        assert got.layout == ref.layout and got.padding == ref.padding
        assert launch_cache._arg_key(got) == launch_cache.descriptor_key(got)  # the carried key is the computed one
    with pytest.raises(ValueError, match="contiguous"):
        gluon_bwd.tensor_desc(t.transpose(0, 1), rows, cols, block)


def test_tensor_desc_refuses_a_wrong_element_count():
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from flashmask import gluon_bwd

    with pytest.raises(ValueError, match="64 x 128 elements"):
        gluon_bwd.tensor_desc(torch.zeros(32, 128), 64, 128, [64, 128])


def test_import_failure_falls_back_to_triton(monkeypatch):
    """A Triton whose Gluon lacks what ``gluon_bwd`` imports, met at launch time: one warning, Triton kernels."""
    import sys

    import flashmask

    monkeypatch.setenv("FLASHMASK_BWD", "triton")
    want = _grads()
    monkeypatch.setenv("FLASHMASK_BWD", "auto")
    monkeypatch.setattr(tf, "gluon_bwd_eligible", lambda *a, **k: not tf._FAILED["backward"])
    monkeypatch.setitem(tf._FAILED, "backward", [])
    monkeypatch.delattr(flashmask, "gluon_bwd", raising=False)
    monkeypatch.setattr(tf, "_GLUON_MODULES", {})  # as in a process that has not launched a Gluon kernel yet
    monkeypatch.setitem(sys.modules, "flashmask.gluon_bwd", None)  # the import raises ModuleNotFoundError
    with pytest.warns(RuntimeWarning, match="Gluon backward failed.*ModuleNotFoundError"):
        got = _grads()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def _gate_fresh(monkeypatch):
    """Gluon in scope for every call (as on an H100 / H200), the version gate not yet checked or warned."""
    monkeypatch.setattr(tf, "_hopper_gluon_shape", lambda *a: True)
    monkeypatch.setattr(tf, "_GATE", [])
    monkeypatch.setattr(tf, "_GATE_WARNED", [])
    for which in ("fwd", "bwd"):
        monkeypatch.setenv(f"FLASHMASK_{which.upper()}", "auto")


def _no_gluon_run(monkeypatch):
    """Make any Gluon launch fail the test: the gate must stop it first."""
    import flashmask

    def never(*args, **kwargs):
        raise AssertionError("a Gluon kernel was launched past the gate")

    for which in ("fwd", "bwd"):
        module = getattr(flashmask, f"gluon_{which}", None)
        if module is not None:
            monkeypatch.setattr(module, "launch", never)


def _one_warning(record, match: str) -> None:
    gate = [w for w in record if issubclass(w.category, RuntimeWarning) and "Gluon" in str(w.message)]
    assert len(gate) == 1, [str(w.message) for w in gate]
    assert re.search(match, str(gate[0].message)), str(gate[0].message)


@pytest.mark.parametrize("version", ["3.5.1", "3.9.0", "4.0.0"])
def test_other_triton_release_runs_triton_kernels_with_one_warning(monkeypatch, version):
    """On a Triton release outside ``SUPPORTED_TRITON`` the Gluon kernels are not attempted under ``auto``: the
    forward and the backward (called twice) run the Triton kernels with the same results, and one warning names
    the release."""
    want_out = _out()
    want_grads = _grads()
    _gate_fresh(monkeypatch)
    _no_gluon_run(monkeypatch)
    monkeypatch.setattr(tf.triton, "__version__", version)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            got_out = _out()
            got_grads = _grads()
    _one_warning(record, rf"Triton {re.escape(version)} is not a release the Gluon kernels were built for")
    assert all(torch.equal(a, b) for a, b in zip(got_out, want_out))
    assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads))


@pytest.mark.parametrize("missing", ["triton.experimental.gluon", "triton.experimental.gluon.language.nvidia.hopper",
                                     "flashmask.gluon_fwd"])
def test_missing_gluon_api_runs_triton_kernels_with_one_warning(monkeypatch, missing):
    """On a supported release whose Gluon API does not import (a module removed or moved), the gate runs the
    Triton kernels for the forward and the backward with one warning, and never launches a Gluon kernel."""
    import sys

    want_out = _out()
    want_grads = _grads()
    _gate_fresh(monkeypatch)
    monkeypatch.setattr(tf.triton, "__version__", "{}.{}.0".format(*tf.SUPPORTED_TRITON[0]))
    for name in [m for m in sys.modules if m in ("flashmask.gluon_fwd", "flashmask.gluon_bwd")]:
        monkeypatch.delitem(sys.modules, name)
    import flashmask

    for which in ("gluon_fwd", "gluon_bwd"):
        monkeypatch.delattr(flashmask, which, raising=False)
    monkeypatch.setattr(tf, "_GLUON_MODULES", {})
    monkeypatch.setitem(sys.modules, missing, None)  # importing it raises ModuleNotFoundError
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            got_out = _out()
            got_grads = _grads()
    _one_warning(record, r"Gluon API differs \(ModuleNotFoundError")
    assert all(torch.equal(a, b) for a, b in zip(got_out, want_out))
    assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads))


def test_forced_gluon_skips_the_version_gate(monkeypatch):
    """``FLASHMASK_FWD=gluon`` tries the Gluon forward on any Triton release (no gate, no warning); its failure
    raises."""
    _gate_fresh(monkeypatch)
    monkeypatch.setattr(tf.triton, "__version__", "9.9.0")
    q = torch.zeros(1, 128, 2, 128, dtype=torch.bfloat16)
    monkeypatch.setenv("FLASHMASK_FWD", "gluon")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tf.gluon_fwd_eligible(q, q, q)
    monkeypatch.setenv("FLASHMASK_FWD", "auto")
    with pytest.warns(RuntimeWarning, match="not a release"):
        assert not tf.gluon_fwd_eligible(q, q, q)
