"""Fused RMSNorm, RoPE and SwiGLU: ``torch.compile`` (Inductor emits Triton on CUDA) with an exact eager fallback.

Each op has an eager reference in Hugging Face order (the math of ``paddlenlp_ext.transformers.llama.modeling``)
and a fused entry point that runs the same function compiled when every tensor is a plain CUDA tensor, and the
eager function otherwise (CPU, DTensors under TP / sequence parallel, or inside an outer ``torch.compile`` trace).
PaddleNLP counterparts: ``use_fused_rms_norm`` (``paddle.incubate.nn.functional.fused_rms_norm``),
``use_fused_rope`` (``fused_rotary_position_embedding``) and ``swiglu`` (``paddle.incubate.nn.functional.swiglu``).

Compilation: ``torch.compile(fn, dynamic=None)``: the first call specialises on shapes, a second shape makes
Dynamo recompile once with symbolic sizes ("automatic dynamic shapes"), so packs of other lengths reuse that graph.
Inductor's ``emulate_precision_casts`` is on where the installed torch has it, so fused bf16 code rounds where
eager rounds (explicit casts). Under bf16 the fused kernels still skip the bf16 rounding of intermediate results
of *implicit* bf16 ops (e.g. ``x * cos`` before ``+ rotate_half(x) * sin``), so they match eager to about one
bf16 ulp, not bitwise; in fp32 they agree to fp32 rounding (tests/fused_ops).

``COMPILE_ON_CPU`` (default False) compiles on CPU too (needs a C++ compiler; used by the tests).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

COMPILE_ON_CPU = False
_compiled: dict = {}
_failed: set = set()


# ----------------------------------------------------------------------------------------------- eager references
def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x^2) + eps))``: statistics in fp32, cast back to ``x.dtype`` before the weight
    multiply (HF ``LlamaRMSNorm``). ``x [..., E]``, ``weight [E]``; result dtype = promote(weight, x)."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_eager(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate ``q [B, L, H, D]`` and ``k [B, L, H_k, D]`` by ``cos, sin [B, L, D]`` (half-split / rotate_half
    layout, HF and PaddleNLP); cos/sin are cast to each input's dtype first, results keep the input dtypes."""
    def rot(x):
        c, s = cos.to(x.dtype)[:, :, None], sin.to(x.dtype)[:, :, None]
        return x * c + _rotate_half(x) * s
    return rot(q), rot(k)


def rope_hf_eager(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
    """``transformers``' ``apply_rotary_pos_emb`` (``x * cos + rotate_half(x) * sin``, in the promoted dtype of x
    and cos, as transformers computes it) on sequence-major ``q [B, L, H, D]`` and ``k [B, L, H_k, D]`` with
    ``cos, sin [B, L, D]``, then cast to ``dtype``."""
    c, s = cos[:, :, None], sin[:, :, None]
    return (q * c + _rotate_half(q) * s).to(dtype), (k * c + _rotate_half(k) * s).to(dtype)


def swiglu_eager(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (Shazeer, arXiv 2002.05202), any equal shapes, in the input dtype."""
    return F.silu(gate) * up


# ----------------------------------------------------------------------------------------------- dispatch
def _inductor_options() -> dict:
    try:
        import torch._inductor.config as icfg
    except Exception:  # pragma: no cover - torch without inductor
        return {}
    return {"emulate_precision_casts": True} if hasattr(icfg, "emulate_precision_casts") else {}


def _get_compiled(fn):
    c = _compiled.get(fn)
    if c is None:
        c = torch.compile(fn, dynamic=None, options=_inductor_options())
        _compiled[fn] = c
    return c


def _is_plain(t) -> bool:
    if not isinstance(t, torch.Tensor) or type(t) not in (torch.Tensor, torch.nn.Parameter):
        return False  # DTensor, FakeTensor, other subclasses: eager
    return t.device.type == "cuda" or (COMPILE_ON_CPU and t.device.type == "cpu")


def _dispatch(fn, *tensors_and_args, tensors: int, eager=None):
    """Run ``fn`` compiled when the first ``tensors`` arguments are plain CUDA tensors, else eagerly (``eager``,
    an equivalent function better suited to eager mode, when given)."""
    eager = eager or fn
    if fn in _failed or torch.compiler.is_compiling() or not all(_is_plain(t) for t in tensors_and_args[:tensors]):
        return eager(*tensors_and_args)
    try:
        return _get_compiled(fn)(*tensors_and_args)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # a broken toolchain must not stop training: fall back once, loudly
        _failed.add(fn)
        logger.warning("torch.compile of %s failed (%s: %s); using the eager op from now on", fn.__name__,
                       type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return eager(*tensors_and_args)


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`rms_norm_eager`, compiled into one kernel (forward) on CUDA. Shapes/dtypes as the eager op."""
    return _dispatch(rms_norm_eager, x, weight, eps, tensors=2)


def fused_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """:func:`rope_eager` on q and k in one compiled region on CUDA. Returns ``(q_rot, k_rot)``."""
    return _dispatch(rope_eager, q, k, cos, sin, tensors=4)


def fused_rope_hf(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
    """:func:`rope_hf_eager` on q and k in one compiled region on CUDA. Returns ``(q_rot, k_rot)`` in ``dtype``."""
    return _dispatch(rope_hf_eager, q, k, cos, sin, dtype, tensors=4)


def fused_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`swiglu_eager` compiled into one kernel (forward and backward) on CUDA."""
    return _dispatch(swiglu_eager, gate, up, tensors=2)
