"""Keep state dicts in the natural (unpermuted) layout for parameters stored rank-major under TP.

``tp_styles.FusedColwiseParallel``-style sharding stores a fused weight permuted along one dimension
(``index``: ``stored = natural.index_select(dim, index)``) so that ``Shard(dim)`` gives each rank its blocks.
Everything that reads or writes whole tensors must see the natural layout instead, so that a checkpoint saved
under TP 2 loads under TP 1, FSDP or TP 4, and an export equals the single-process one. This module does that
with hooks, invisible to the trainer:

- model: a ``state_dict`` post-hook on the owning module returns natural-layout ``DTensor`` s (same mesh,
  placements and global shape as the parameter); a ``load_state_dict`` pre-hook permutes incoming tensors back.
  Covers ``get_state_dict`` / ``set_state_dict`` + DCP, ``get_model_state_dict(full_state_dict=True)``
  (HF export, LoRA adapter save) and plain ``state_dict()``.
- optimizer: a process-wide optimizer step post-hook (registered on the first fused parameter) attaches, once per
  optimizer that holds a permuted parameter, a ``state_dict`` post-hook and a ``load_state_dict`` pre-hook doing
  the same for the per-parameter states (AdamW ``exp_avg`` / ``exp_avg_sq``). DCP's ``get_state_dict`` runs one
  zero-lr ``step()`` on a fresh optimizer before reading its state, so the hooks are in place on load too.

Each conversion all-gathers the tensor once (checkpoint time only; training never converts).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn

_ATTR = "_tp_fused_layout"  # module attribute: {param name: (dim, index)}
_FUSED_MODULES: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()
_HOOKED_OPTIMIZERS: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
_STEP_HOOK = None


def _inverse(index: torch.Tensor) -> torch.Tensor:
    return torch.argsort(index)


def relayout(t: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``t.index_select(dim, index)`` of the *global* tensor, returned with ``t``'s mesh and placements.

    Args:
        t: a ``DTensor`` whose placements shard contiguous blocks (``Shard``, FSDP2's ``_StridedShard`` over TP,
            ``Replicate``), or a plain full tensor.
        dim: the permuted dimension; index: int64 ``[t.shape[dim]]``.

    Returns:
        A new tensor (``DTensor`` like ``t``); ``t`` is not modified. Collective for a ``DTensor``.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t.index_select(dim, index.to(t.device))
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    full = t.full_tensor().index_select(dim, index.to(t.device))
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    local = full[tuple(slice(o, o + s) for o, s in zip(offset, shape))].contiguous()
    if tuple(local.shape) != tuple(t.to_local().shape):
        raise RuntimeError(f"relayout: local shard {tuple(t.to_local().shape)} of a {tuple(t.shape)} DTensor with "
                           f"placements {t.placements} is not the contiguous block {tuple(local.shape)} at {offset}")
    return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape,
                              stride=t.stride())


def _state_dict_post_hook(module, state_dict, prefix, _local_metadata):
    for pname, (dim, index) in getattr(module, _ATTR, {}).items():
        key = prefix + pname
        if key in state_dict and state_dict[key] is not None:
            state_dict[key] = relayout(state_dict[key].detach(), dim, _inverse(index))


def _load_pre_hook(module, state_dict, prefix, *_args):
    for pname, (dim, index) in getattr(module, _ATTR, {}).items():
        key = prefix + pname
        if key in state_dict and state_dict[key] is not None:
            state_dict[key] = relayout(state_dict[key], dim, index)


def register_fused_layout(module: nn.Module, pname: str, dim: int, index: torch.Tensor) -> None:
    """Record that ``module.<pname>`` is stored as ``natural.index_select(dim, index)``; install the hooks.

    Called by the fused TP styles right after they place the parameter. Idempotent per (module, pname).
    """
    layouts = getattr(module, _ATTR, None)
    if layouts is None:
        layouts = {}
        setattr(module, _ATTR, layouts)
        if hasattr(module, "register_state_dict_post_hook"):
            module.register_state_dict_post_hook(_state_dict_post_hook)
        else:  # torch < 2.3
            module._register_state_dict_hook(_state_dict_post_hook)
        module.register_load_state_dict_pre_hook(_load_pre_hook)
    layouts[pname] = (dim, index.cpu())
    _FUSED_MODULES.add(module)
    _install_step_hook()


def _fused_params() -> dict[int, tuple[torch.Tensor, int, torch.Tensor]]:
    """``id(param) -> (param, dim, index)`` of every live permuted parameter (looked up now: FSDP2 replaces
    parameter objects after TP)."""
    out = {}
    for module in list(_FUSED_MODULES):
        for pname, (dim, index) in getattr(module, _ATTR, {}).items():
            p = getattr(module, pname, None)
            if p is not None:
                out[id(p)] = (p, dim, index)
    return out


def _optimizer_layouts(optimizer, state_dict: dict | None = None) -> dict:
    """State key -> ``(param, dim, index)`` of the optimizer's permuted parameters.

    Keys are those of ``state_dict["param_groups"][*]["params"]`` matched by position with the optimizer's
    own ``param_groups`` (``Optimizer.load_state_dict``'s rule): ints from ``Optimizer.state_dict()``, parameter
    FQNs from DCP's ``set_state_dict``. Without ``state_dict``, the position itself.
    """
    fused = _fused_params()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    keys = list(range(len(params))) if state_dict is None else \
        [k for g in state_dict.get("param_groups", []) for k in g["params"]]
    return {key: fused[id(p)] for key, p in zip(keys, params) if id(p) in fused}


def _convert_states(states: dict, layouts: dict, to_natural: bool) -> dict:
    out = dict(states)  # the values are the optimizer's live per-parameter dicts: never modify them in place
    for key, (param, dim, index) in layouts.items():
        if key in out:
            idx = _inverse(index) if to_natural else index
            out[key] = {k: (relayout(v, dim, idx) if isinstance(v, torch.Tensor) and v.shape == param.shape else v)
                        for k, v in out[key].items()}
    return out


def _optim_state_dict_post_hook(optimizer, state_dict):
    layouts = _optimizer_layouts(optimizer, state_dict)
    if layouts:
        state_dict["state"] = _convert_states(state_dict["state"], layouts, to_natural=True)
    return state_dict


def _optim_load_pre_hook(optimizer, state_dict):
    layouts = _optimizer_layouts(optimizer, state_dict)
    if not layouts:
        return state_dict
    state_dict = dict(state_dict)
    state_dict["state"] = _convert_states(state_dict["state"], layouts, to_natural=False)
    return state_dict


def _step_post_hook(optimizer, _args, _kwargs):
    if optimizer in _HOOKED_OPTIMIZERS:
        return
    _HOOKED_OPTIMIZERS.add(optimizer)
    if _optimizer_layouts(optimizer):
        optimizer.register_state_dict_post_hook(_optim_state_dict_post_hook)
        optimizer.register_load_state_dict_pre_hook(_optim_load_pre_hook)


def _install_step_hook() -> None:
    global _STEP_HOOK
    if _STEP_HOOK is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _STEP_HOOK = register_optimizer_step_post_hook(_step_post_hook)


def attach_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Install the optimizer hooks now (they are otherwise installed on its first ``step()``). Optional."""
    _step_post_hook(optimizer, (), {})
