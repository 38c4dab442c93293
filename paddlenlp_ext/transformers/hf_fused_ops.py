"""PaddleNLP's ``use_fused_rms_norm`` and ``use_fused_swiglu`` on a ``transformers`` model.

The family's own RMSNorm and gated-MLP modules keep their weights and names; their ``forward`` becomes the compiled
op of :mod:`paddlenlp_ext.ops.elementwise` (one Triton kernel on CUDA, the eager math elsewhere, under tensor
parallelism and inside an outer ``torch.compile``), as Liger-Kernel patches model instances. A module is fused
only when its computation is the one the op implements, checked from ``transformers`` itself rather than from a
list of families:

- RMSNorm: the class's ``forward`` has the source of ``transformers``' ``LlamaRMSNorm.forward`` (fp32 statistics,
  ``weight * x.to(input_dtype)``): Llama, Mistral, Mixtral, Qwen2, Qwen3 (with its q / k norms), Phi-3, ...;
  Gemma's ``(1 + weight)`` norm is left alone.
- SwiGLU: the class's ``forward`` has the source of ``LlamaMLP.forward``
  (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``) and ``act_fn`` computes SiLU (checked on a probe tensor):
  Gemma's GELU MLP and Phi-3's fused ``gate_up_proj`` are left alone.

``use_fused_rope`` stays with the native models: ``transformers`` applies RoPE through a module-level function of
each modeling file, which cannot be replaced for one model only.
"""

from __future__ import annotations

import inspect
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import fused_rms_norm, fused_swiglu

NATIVE_ONLY_KEYS = ("use_fused_rope",)
FUSABLE_KEYS = ("use_fused_rms_norm", "use_fused_swiglu")


def _source(fn) -> str | None:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return None


def _reference_sources() -> tuple[str | None, str | None]:
    from transformers.models.llama import modeling_llama as llama

    return _source(llama.LlamaRMSNorm.forward), _source(llama.LlamaMLP.forward)


def _is_silu(act) -> bool:
    probe = torch.linspace(-6.0, 6.0, 97)
    try:
        with torch.no_grad():
            return torch.allclose(act(probe), F.silu(probe), rtol=1e-6, atol=1e-7)
    except Exception:
        return False


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return fused_rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _swiglu_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(fused_swiglu(self.gate_proj(x), self.up_proj(x)))


_FORWARDS = {"use_fused_rms_norm": _rms_norm_forward, "use_fused_swiglu": _swiglu_forward}


def _matches(model: nn.Module, rms_norm: bool, swiglu: bool) -> list[tuple[nn.Module, str]]:
    """``(module, key)`` for every module of ``model`` that the requested keys fuse (see the module docstring).
    A module whose ``forward`` is already replaced on the instance by another tool is left alone."""
    norm_src, mlp_src = _reference_sources()
    sources: dict[type, str | None] = {}
    out = []
    for m in model.modules():
        cls = type(m)
        if cls not in sources:
            sources[cls] = _source(cls.forward)
        src = sources[cls]
        own = vars(m).get("forward")
        if src is None or (own is not None and getattr(own, "__func__", None) not in _FORWARDS.values()):
            continue
        if rms_norm and src == norm_src and hasattr(m, "variance_epsilon"):
            out.append((m, "use_fused_rms_norm"))
        elif (swiglu and src == mlp_src and all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj"))
              and _is_silu(m.act_fn)):
            out.append((m, "use_fused_swiglu"))
    return out


def fuse_modules(model: nn.Module, rms_norm: bool, swiglu: bool) -> dict[str, list[str]]:
    """Route the matching RMSNorm / gated-MLP modules of ``model`` (a ``transformers`` model, possibly wrapped) to
    the fused ops, in place; idempotent. Returns ``{"use_fused_rms_norm": [class names], "use_fused_swiglu":
    [...]}``, the classes fused for each requested key (empty: nothing in the model matches)."""
    done: dict[str, set] = {k: set() for k, on in (("use_fused_rms_norm", rms_norm), ("use_fused_swiglu", swiglu))
                            if on}
    for m, key in _matches(model, rms_norm, swiglu):
        m.forward = types.MethodType(_FORWARDS[key], m)
        done[key].add(type(m).__name__)
    return {k: sorted(v) for k, v in done.items()}


def apply_fused_op_keys(model: nn.Module, args, model_name_or_path: str) -> dict[str, list[str]]:
    """The ``use_fused_*`` training keys on a ``transformers``-implemented model (``hf_causal_lm.is_hf_model``;
    nothing to do on our native models, which read the keys from their config): fuse what
    :func:`fuse_modules` can, refuse the rest.

    Raises:
        ValueError: ``use_fused_rope: true`` (native models only), or a key whose modules this family computes
            differently (e.g. Gemma's RMSNorm), naming the key, the model_type and the way out.
    """
    from .hf_causal_lm import is_hf_model

    if not is_hf_model(model):
        return {}
    mt = getattr(model.config, "model_type", "?")
    on = [k for k in NATIVE_ONLY_KEYS if getattr(args, k, False)]
    if on:
        raise ValueError(f"{', '.join(on)}: true acts on the native Llama / ERNIE-3.5-SE models only; "
                         f"{model_name_or_path} (model_type {mt!r}) runs transformers' implementation. Remove the "
                         f"key(s), or for a Llama set model_implementation: native")
    want = {k: bool(getattr(args, k, False)) for k in FUSABLE_KEYS}
    if not any(want.values()):
        return {}
    found = {k for _, k in _matches(model, want["use_fused_rms_norm"], want["use_fused_swiglu"])}
    missing = [k for k, on in want.items() if on and k not in found]
    if missing:  # refused before anything is patched
        what = {"use_fused_rms_norm": "an RMSNorm computed as Llama's (weight * normalised x)",
                "use_fused_swiglu": "an MLP computed as down_proj(silu(gate_proj(x)) * up_proj(x))"}
        raise ValueError(f"{', '.join(missing)}: true needs {'; '.join(what[k] for k in missing)}; "
                         f"{model_name_or_path} (model_type {mt!r}) has none that matches transformers' Llama "
                         f"code. Remove the key(s)")
    return fuse_modules(model, rms_norm=want["use_fused_rms_norm"], swiglu=want["use_fused_swiglu"])
