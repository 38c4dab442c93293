"""PaddleNLP's ``use_fused_rms_norm``, ``use_fused_rope`` and ``use_fused_swiglu`` on a ``transformers`` model.

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
- RoPE: the attention class's ``forward`` calls the global ``apply_rotary_pos_emb``, and that function and the
  ``rotate_half`` it calls have the bytecode of ``transformers``' Llama ones (Llama, Mistral, Mixtral, Qwen2 / 3 and
  their MoE variants, Gemma 1-3, ...); Phi-3's own function (written for a partial rotary part) is left alone. The
  module-level function is not replaced: the instance gets a copy of the class's ``forward`` whose code reads that
  name from a global of its own (``FUSED_ROPE_GLOBAL``, added to the modeling file's namespace and holding
  :func:`hf_apply_rotary_pos_emb`; every other global is the modeling file's, live). Decorators such as
  ``deprecate_kwarg`` are rebuilt around it. Other models in the process keep transformers' function.
"""

from __future__ import annotations

import dis
import inspect
import logging
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import fused_rms_norm, fused_swiglu
from ..ops.elementwise import fused_rope_hf

logger = logging.getLogger(__name__)

FUSABLE_KEYS = ("use_fused_rms_norm", "use_fused_rope", "use_fused_swiglu")


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


def hf_apply_rotary_pos_emb(original):
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` of ``transformers`` (q ``[B, H, L, D]``, k
    ``[B, H_k, L, D]``, cos / sin ``[B, L, D]``) computed by :func:`~paddlenlp_ext.ops.elementwise.fused_rope_hf`:
    one compiled kernel on CUDA, writing q and k sequence-major (``[B, L, H, D]`` memory, returned as the usual
    ``[B, H, L, D]`` views), the layout the FlashMask backend reads without a copy. Under autocast the results are
    in the autocast dtype: every attention path's forward casts q and k to it (SDPA and matmuls by autocast, the
    FlashMask backend itself), so the one rounding moves here and q / k are written in half the bytes. Two
    consequences off the FlashMask path: paths that expand k for GQA (``repeat_kv``: eager, SDPA with a mask) sum
    a group's k gradients in the autocast dtype, and a KV cache filled under autocast holds keys in it. Other shapes
    or ``unsqueeze_dim`` values go to ``original``."""
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if (unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or q.dtype != k.dtype
                or not q.shape[-1] == k.shape[-1] == cos.shape[-1]):
            return original(q, k, cos, sin, unsqueeze_dim)
        dev = q.device.type
        dtype = (torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev)
                 else torch.promote_types(q.dtype, cos.dtype))
        q_rot, k_rot = fused_rope_hf(q.transpose(1, 2), k.transpose(1, 2), cos, sin, dtype)
        return q_rot.transpose(1, 2), k_rot.transpose(1, 2)
    return apply_rotary_pos_emb


def _plain_function(fn):
    """``fn`` without its wrappers: ``functools.wraps`` decorators, and the module that ``transformers``'
    ``use_kernel_forward_from_hub`` makes of a function when the ``kernels`` package is installed (an instance of
    an ``nn.Module`` class whose ``forward`` calls the function, held as its closure variable ``func``)."""
    if isinstance(fn, nn.Module):
        forward = getattr(type(fn), "forward", None)
        code = getattr(forward, "__code__", None)
        if code is not None and "func" in code.co_freevars:
            held = _cell_contents(forward.__closure__[code.co_freevars.index("func")])
            if isinstance(held, types.FunctionType):
                fn = held
    return inspect.unwrap(fn)


def _code_key(fn) -> tuple | None:
    """What a function computes, without its file, line numbers or docstring."""
    fn = _plain_function(fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    consts = tuple(c for c in code.co_consts if not (isinstance(c, str) and c == fn.__doc__))
    return code.co_code, consts, code.co_names, code.co_varnames, code.co_argcount, fn.__defaults__


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


FUSED_ROPE_GLOBAL = "_paddlenlp_ext_fused_apply_rotary_pos_emb"


def _with_global_renamed(fn, name: str, new_name: str):
    """A copy of ``fn`` whose code reads global ``new_name`` where it read global ``name`` (its other globals are
    its module's, live), rebuilt through ``functools.wraps`` decorators (each wrapper holds the next function in a
    closure cell); None when a wrapper does not, or when ``fn`` uses ``name`` other than as a global."""
    inner = getattr(fn, "__wrapped__", None)
    if not isinstance(fn, types.FunctionType):
        return None
    if inner is None:
        if any(ins.argval == name and ins.opname != "LOAD_GLOBAL" for ins in dis.get_instructions(fn)):
            return None  # an attribute or local of that name shares co_names: renaming it would break the code
        code = fn.__code__.replace(co_names=tuple(new_name if n == name else n for n in fn.__code__.co_names))
        new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    else:
        cells = fn.__closure__ or ()
        held = [i for i, c in enumerate(cells) if _cell_contents(c) is inner]
        new_inner = _with_global_renamed(inner, name, new_name) if len(held) == 1 else None
        if new_inner is None:
            return None
        closure = tuple(types.CellType(new_inner) if i == held[0] else c for i, c in enumerate(cells))
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__, new.__qualname__, new.__doc__ = fn.__kwdefaults__, fn.__qualname__, fn.__doc__
    new.__dict__.update(fn.__dict__)
    if inner is not None:
        new.__wrapped__ = new_inner
    return new


_ROPE_FORWARDS: dict[type, object] = {}  # attention class -> its forward with the fused RoPE (None: not fusable)


def _rope_forward(cls):
    """The ``forward`` of attention class ``cls`` with :func:`hf_apply_rotary_pos_emb`, or None when ``cls`` does
    not apply transformers' Llama RoPE function."""
    if cls not in _ROPE_FORWARDS:
        from transformers.models.llama import modeling_llama as llama

        fn, new = getattr(cls, "forward", None), None
        inner = inspect.unwrap(fn)
        g = getattr(inner, "__globals__", {})
        rope = g.get("apply_rotary_pos_emb")
        rope_globals = getattr(_plain_function(rope), "__globals__", {})
        if ("apply_rotary_pos_emb" in getattr(getattr(inner, "__code__", None), "co_names", ())
                and _code_key(rope) == _code_key(llama.apply_rotary_pos_emb)
                and _code_key(rope_globals.get("rotate_half")) == _code_key(llama.rotate_half)):
            new = _with_global_renamed(fn, "apply_rotary_pos_emb", FUSED_ROPE_GLOBAL)
            if new is not None and not isinstance(g.get(FUSED_ROPE_GLOBAL), types.FunctionType):
                g[FUSED_ROPE_GLOBAL] = hf_apply_rotary_pos_emb(rope)
        _ROPE_FORWARDS[cls] = new
    return _ROPE_FORWARDS[cls]


def _matches(model: nn.Module, rms_norm: bool, swiglu: bool, rope: bool = False) -> list[tuple[nn.Module, str]]:
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
        ours = getattr(own, "__func__", None)
        if own is not None and (ours is None or (ours not in _FORWARDS.values()
                                                 and ours not in _ROPE_FORWARDS.values())):
            continue
        if rope and _rope_forward(cls) is not None:
            out.append((m, "use_fused_rope"))
            continue
        if src is None:
            continue
        if rms_norm and src == norm_src and hasattr(m, "variance_epsilon"):
            out.append((m, "use_fused_rms_norm"))
        elif (swiglu and src == mlp_src and all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj"))
              and _is_silu(m.act_fn)):
            out.append((m, "use_fused_swiglu"))
    return out


def fuse_modules(model: nn.Module, rms_norm: bool, swiglu: bool, rope: bool = False) -> dict[str, list[str]]:
    """Route the matching RMSNorm / gated-MLP / attention modules of ``model`` (a ``transformers`` model, possibly
    wrapped) to the fused ops, in place; idempotent. Returns ``{"use_fused_rms_norm": [class names],
    "use_fused_rope": [...], "use_fused_swiglu": [...]}`` for the requested keys, the classes fused for each (empty:
    nothing in the model matches)."""
    on = {"use_fused_rms_norm": rms_norm, "use_fused_rope": rope, "use_fused_swiglu": swiglu}
    done: dict[str, set] = {k: set() for k, want in on.items() if want}
    for m, key in _matches(model, rms_norm, swiglu, rope):
        fwd = _rope_forward(type(m)) if key == "use_fused_rope" else _FORWARDS[key]
        m.forward = types.MethodType(fwd, m)
        done[key].add(type(m).__name__)
    return {k: sorted(v) for k, v in done.items()}


def apply_fused_op_keys(model: nn.Module, args, model_name_or_path: str) -> dict[str, list[str]]:
    """The ``use_fused_*`` training keys on a ``transformers``-implemented model (``hf_causal_lm.is_hf_model``;
    nothing to do on our native models, which read the keys from their config): fuse what
    :func:`fuse_modules` can, refuse the rest.

    Raises:
        ValueError: a key whose modules this family computes differently (e.g. Gemma's RMSNorm, Phi-3's partial
            RoPE), naming the key, the model_type and the way out.
    """
    from .hf_causal_lm import is_hf_model

    if not is_hf_model(model):
        return {}
    mt = getattr(model.config, "model_type", "?")
    want = {k: bool(getattr(args, k, False)) for k in FUSABLE_KEYS}
    if not any(want.values()):
        return {}
    found = {k for _, k in _matches(model, want["use_fused_rms_norm"], want["use_fused_swiglu"],
                                    want["use_fused_rope"])}
    missing = [k for k, on in want.items() if on and k not in found]
    if missing:  # refused before anything is patched
        what = {"use_fused_rms_norm": "an RMSNorm computed as Llama's (weight * normalised x)",
                "use_fused_swiglu": "an MLP computed as down_proj(silu(gate_proj(x)) * up_proj(x))",
                "use_fused_rope": "attention that applies RoPE by transformers' Llama apply_rotary_pos_emb"}
        raise ValueError(f"{', '.join(missing)}: true needs {'; '.join(what[k] for k in missing)}; "
                         f"{model_name_or_path} (model_type {mt!r}) has none that matches transformers' Llama "
                         f"code. Remove the key(s)")
    done = fuse_modules(model, rms_norm=want["use_fused_rms_norm"], swiglu=want["use_fused_swiglu"],
                        rope=want["use_fused_rope"])
    for key, classes in done.items():
        logger.info("%s: %s (model_type %r) routed to the fused op", key, ", ".join(classes), mt)
    return done
