"""Which kernel runs a forward or a backward: the Hopper Gluon kernels (:mod:`flashmask.gluon_fwd`,
:mod:`flashmask.gluon_bwd`) where they apply, else the Triton kernels (:mod:`flashmask.triton_launch`).

The Gluon kernels are written against Triton's experimental Gluon API as shipped in the Triton releases of
``SUPPORTED_TRITON``. With ``FLASHMASK_FWD`` / ``FLASHMASK_BWD`` = ``auto`` (:mod:`flashmask.env`) they are only
attempted on those releases, and only if their modules import; on any other Triton, or when the API is missing or
changed, the Triton kernels run, with one warning per process where Gluon would otherwise have run. A launch that
fails later (a compile error) also falls back, with one warning per direction; out of memory falls back for that
call only. ``gluon`` skips the version gate and re-raises failures.

Shape legend: B batch, S_q / S_k query / key length, H_q / H_k query / kv heads, D head dim.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings

import torch
import triton

from .env import interpreting, kernel_choice
from .launch_config import LOG2E
from .mask_cache import capturing
from .triton_launch import preprocess, triton_backward, triton_forward
from .triton_prep import MaskVectors

SUPPORTED_TRITON = ((3, 6),)  # (major, minor) releases whose Gluon API the kernels were built and tested on

_FAILED: dict = {"forward": [], "backward": []}  # "Type: message" of a Gluon kernel's failure (then Triton only)
_GATE: list = []  # once checked: [why the Gluon kernels are not used on this Triton, "" when they are]
_GATE_WARNED: list = []


def _triton_version() -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2])


def gluon_unavailable() -> str:
    """Why this process does not run the Gluon kernels under ``auto`` ("" when it does): a Triton release outside
    ``SUPPORTED_TRITON``, or Gluon modules that do not import (an API that moved or is missing). Checked once."""
    if not _GATE:
        if _triton_version() not in SUPPORTED_TRITON:
            supported = ", ".join(".".join(map(str, v)) for v in SUPPORTED_TRITON)
            _GATE.append(f"Triton {triton.__version__} is not a release the Gluon kernels were built for "
                         f"({supported})")
        else:
            try:
                from . import gluon_bwd, gluon_fwd  # noqa: F401
            except Exception as e:  # ImportError, AttributeError: the experimental API changed
                _GATE.append(f"Triton {triton.__version__}'s Gluon API differs ({type(e).__name__}: "
                             f"{str(e)[:200]})")
            else:
                _GATE.append("")
    return _GATE[0]


def _gluon_gate(mode: str) -> bool:
    """``gluon`` always passes; ``auto`` passes when :func:`gluon_unavailable` is empty, else warns once."""
    if mode == "gluon":
        return True
    why = gluon_unavailable()
    if why and not _GATE_WARNED:
        _GATE_WARNED.append(why)
        warnings.warn(f"flashmask: {why}; the Triton kernels run instead (FLASHMASK_FWD=triton and "
                      "FLASHMASK_BWD=triton silence this, =gluon tries the Gluon kernels anyway)", RuntimeWarning,
                      stacklevel=5)
    return not why


GLUON_FWD_HEAD_DIMS = (64, 128, 256)
GLUON_BWD_HEAD_DIMS = (64, 128, 256)


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    """``torch.cuda.get_device_capability`` of a device index, cached: it is asked twice per attention call, and
    a call at B = 1, 8K is bound by host time (docs/kernel_notes.md)."""
    return torch.cuda.get_device_capability(index)


def _hopper_gluon_shape(ts, q, s_q_multiple: int, head_dims: tuple[int, ...]) -> bool:
    """The scope of the Gluon kernels: CUDA sm_90 (H100 / H200), bf16 / fp16, D in ``head_dims``, ``S_q`` a
    multiple of ``s_q_multiple``, ``S_k % 128 == 0``, every tensor of ``ts`` contiguous, 16-byte aligned and of
    q's dtype."""
    if interpreting() or not q.is_cuda or torch.version.hip is not None:
        return False
    b, s_q, h_q, d = q.shape
    if (d not in head_dims or q.dtype not in (torch.bfloat16, torch.float16) or s_q % s_q_multiple
            or ts[1].shape[1] % 128 or _capability(q.device.index) != (9, 0)):
        return False
    return not any(t.dtype != q.dtype or not t.is_contiguous() or t.data_ptr() % 16 for t in ts)


def gluon_fwd_eligible(q, k, v) -> bool:
    """Whether the forward runs the Gluon kernel (two consumer warpgroups that overlap one key block's softmax
    with the previous block's P V product, and a TMA loader): ``FLASHMASK_FWD`` is not ``triton``, the Gluon
    forward has not failed in this process, the tensors are in its scope (:func:`_hopper_gluon_shape`, with
    ``S_q % 128 == 0``) and the Triton release passes the gate. Both forwards are reproducible run to run."""
    mode = kernel_choice("fwd")
    if mode == "triton" or _FAILED["forward"] or not _hopper_gluon_shape((q, k, v), q, 128, GLUON_FWD_HEAD_DIMS):
        return False
    return _gluon_gate(mode)


def gluon_bwd_eligible(q, k, v, do, deterministic: bool) -> bool:
    """Whether the backward runs the Gluon kernel (five products per tile, warp-specialised): ``FLASHMASK_BWD``
    is not ``triton``; the call does not ask for reproducibility (``deterministic`` and
    ``torch.are_deterministic_algorithms_enabled()`` both False: its dQ is summed by TMA reduce-adds in the order
    the tiles finish); the Gluon backward has not failed in this process; the tensors are in its scope
    (:func:`_hopper_gluon_shape`, ``S_q % 64 == 0``); and the Triton release passes the gate."""
    mode = kernel_choice("bwd")
    if mode == "triton" or deterministic or torch.are_deterministic_algorithms_enabled() or _FAILED["backward"]:
        return False
    if not _hopper_gluon_shape((q, k, v, do), q, 64, GLUON_BWD_HEAD_DIMS):
        return False
    return _gluon_gate(mode)


_GLUON_MODULES: dict = {}


def _gluon(name: str):
    """The Gluon kernel module ``name`` of this package (``"gluon_fwd"`` / ``"gluon_bwd"``), imported on first
    use inside a launch, so that an import failure falls back like a failed launch; later calls skip the import
    statement (a package-relative import costs about 2 µs of host time per call)."""
    mod = _GLUON_MODULES.get(name)
    if mod is None:
        mod = _GLUON_MODULES[name] = importlib.import_module(f".{name}", __package__)
    return mod


def _run_gluon(which: str, device, launch_fn):
    """``launch_fn()``, or None when it failed and the Triton ``which`` ("forward" / "backward") should run.

    ``FLASHMASK_FWD`` / ``FLASHMASK_BWD`` = ``gluon`` re-raises, and so does a failure while a CUDA graph is
    captured (the capture may be invalid already). Out of memory falls back for this call only; any other failure
    is recorded in ``_FAILED`` (a string: no frames, so no tensors, kept alive), warns once and switches this
    process to the Triton kernel."""
    try:
        return launch_fn()
    except Exception as e:
        if kernel_choice("fwd" if which == "forward" else "bwd") == "gluon" or capturing(device):
            raise
        if isinstance(e, torch.OutOfMemoryError):
            return None
        _FAILED[which].append(f"{type(e).__name__}: {str(e)[:300]}")
    env = "FLASHMASK_FWD" if which == "forward" else "FLASHMASK_BWD"
    warnings.warn(f"flashmask: the Gluon {which} failed ({_FAILED[which][-1]}); using the Triton {which} from now "
                  f"on ({env}=triton silences this)", RuntimeWarning, stacklevel=5)
    return None


def forward(q, k, v, mv: MaskVectors, causal: bool, scale: float):
    """``(out like q, lse fp32 [B, H_q, S_q])`` of ``softmax(q k^T * scale) v`` under the mask ``mv``, from the
    Gluon forward where :func:`gluon_fwd_eligible`, else the Triton one."""
    if gluon_fwd_eligible(q, k, v):
        def launch_fn():
            gluon_fwd = _gluon("gluon_fwd")
            tiles = gluon_fwd.tiles(q.shape[-1])[:2]
            return gluon_fwd.launch(q, k, v, mv.block_lists(*tiles, by_key=False),
                                    mv.visit_order(*tiles, by_key=False), mv, causal, scale, LOG2E)

        out = _run_gluon("forward", q.device, launch_fn)
        if out is not None:
            return out
    return triton_forward(q, k, v, mv, causal, scale)


def backward(do, q, k, v, o, lse, dlse, mv: MaskVectors, causal: bool, scale: float, deterministic: bool):
    """``(dq, dk, dv)`` shaped like ``q, k, v``, from ``do`` (like o) and the forward's ``o`` / ``lse``; ``dlse``
    fp32 ``[B, H_q, S_q]`` or None (no gradient on the LSE). The Gluon backward where :func:`gluon_bwd_eligible`,
    else the Triton kernels (bitwise reproducible)."""
    if gluon_bwd_eligible(q, k, v, do, deterministic):
        dq_accum = torch.empty(q.shape, dtype=torch.float32, device=q.device)  # zeroed by the preprocess pass
        delta, lse2 = preprocess(o, do, lse, dlse, dq_accum)

        def launch_fn():
            gluon_bwd = _gluon("gluon_bwd")
            tiles = gluon_bwd.tiles(q.shape[-1])
            return gluon_bwd.launch(do, q, k, v, lse2, delta, dq_accum, mv.block_lists(*tiles, by_key=True),
                                    mv.visit_order(*tiles, by_key=True), mv, causal, scale, LOG2E)

        grads = _run_gluon("backward", q.device, launch_fn)
        if grads is not None:
            return grads
    else:
        delta, lse2 = preprocess(o, do, lse, dlse)
    return triton_backward(do, q, k, v, lse2, delta, mv, causal, scale)
