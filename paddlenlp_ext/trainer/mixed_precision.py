"""PaddleNLP's AMP level O2 for one process: bf16 compute weights, fp32 master weights, fp32 gradient accumulation.

PaddleNLP: ``fp16_opt_level: "O2"`` with ``bf16: true`` makes ``paddlenlp/trainer/trainer.py`` call
``paddle.amp.decorate(models, optimizers, level="O2", dtype="bfloat16", master_weight=True)``: the layers hold
bf16 weights, the optimizer keeps fp32 master weights, and ``amp_master_grad`` keeps fp32 master gradients.
:class:`MasterWeights` does the same around the forward/backward of a plain (not FSDP / TP) PyTorch model;
:func:`precision_mode` is the trainer's choice between fp32, O1 (``torch.autocast``) and O2.

Under FSDP2, ``bf16`` already means ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``
(``paddlenlp_ext.distributed.parallelize._fsdp_kwargs``), which is O2; nothing here applies there.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any, Iterator

import torch
from torch import nn

logger = logging.getLogger("paddlenlp_ext.trainer")

__all__ = ["MasterWeights", "precision_mode", "PRECISION_MODES"]

#: ``precision_mode`` results: fp32 | o1 (bf16 autocast, fp32 params) | o2 (MasterWeights + autocast) |
#: o2_fsdp (FSDP2 MixedPrecisionPolicy + autocast)
PRECISION_MODES = ("fp32", "o1", "o2", "o2_fsdp")


def _is_dtensor(t: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(t, DTensor)


def _unique_trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, param)`` of each trainable parameter once (a tied embedding / head appears once)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class MasterWeights:
    """bf16 compute copies of a model's fp32 trainable parameters during forward/backward (AMP O2).

    Invariant: OUTSIDE :meth:`compute` every trainable parameter holds its fp32 master value, so the optimizer
    (fp32 AdamW states), checkpoints, ``save_pretrained``, evaluation and LoRA save/merge see an fp32 model.
    Inside ``with mw.compute():``

    - each trainable parameter ``p`` (fp32, ``[*shape]``) has ``p.data`` swapped for a persistent bf16 copy of the
      same shape (one per parameter, kept between steps). The copy is refreshed from the master (one batched
      ``torch._foreach_copy_``) only when the master may have changed: after an optimizer step (``optimizer``'s
      step post-hook, or :meth:`mark_dirty`), or when ``p._version`` moved (in-place writes such as
      ``load_state_dict``). Fused AdamW does not bump ``_version``: pass the optimizer or call ``mark_dirty()``.
      Writes through ``p.data`` are invisible too (call ``mark_dirty()``).
    - a post-accumulate-grad hook moves each bf16 ``p.grad`` into an fp32 buffer (``buf = g.float()`` on the first
      micro-batch, ``buf.add_(g)`` after) and clears ``p.grad``: gradients accumulate over micro-batches in fp32
      (PaddleNLP ``amp_master_grad``). The hooks do nothing outside ``compute()``.
    - on exit ``p.data`` is the fp32 master again and ``p.grad`` the fp32 buffer (added to an fp32 ``.grad`` that
      was there on entry); the object then holds no gradient, so ``optimizer.zero_grad(set_to_none=True)`` frees it.

    The forward AND backward must both run inside ``compute()`` (autograd saved the bf16 parameters). Frozen
    parameters and buffers are left alone (LoRA's ``cast_frozen_base`` already holds the frozen base in bf16).
    Keep ``torch.autocast`` on around the forward: with bf16 weights it casts nearly nothing and still runs
    softmax / norms / losses in fp32.

    Memory per trainable parameter, bytes: O2 = fp32 master 4 + bf16 copy 2 + fp32 grad 4 + AdamW 8 = 18 (plus a
    transient bf16 grad per parameter in backward); O1 autocast = fp32 4 + fp32 grad 4 + AdamW 8 = 16, plus
    autocast's cached bf16 copy 2 during the step. Activations are bf16 in both (O2 also keeps the residual stream
    and the embedding output in bf16, as Paddle's O2 does).

    Args:
        model: a module whose trainable parameters are fp32 plain tensors (no FSDP / DTensor TP).
        dtype: compute dtype, ``torch.bfloat16`` (default) or ``torch.float16`` (no loss scaling here).
        optimizer: optional; its step post-hook marks the copies stale after every ``step()``.

    Raises:
        ValueError: a trainable parameter is a DTensor (FSDP2 / tensor parallel) or not fp32, or the model has
            no trainable parameter.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16, optimizer: Any = None):
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"MasterWeights: dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        named = _unique_trainable(model)
        if not named:
            raise ValueError("MasterWeights: the model has no parameter with requires_grad=True")
        for name, p in named:
            if _is_dtensor(p):
                raise ValueError(
                    f"MasterWeights: trainable parameter {name!r} is a DTensor (FSDP2 / tensor parallel). Under "
                    "FSDP, bf16 already runs as MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), i.e. "
                    "O2; with tensor parallelism alone use fp16_opt_level O1")
            if p.dtype != torch.float32:
                raise ValueError(
                    f"MasterWeights: trainable parameter {name!r} is {p.dtype}, expected torch.float32 (the master "
                    "weights); load the model in fp32 (dtype=torch.float32) or use fp16_opt_level O1")
        self.dtype = dtype
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.masters: list[torch.Tensor] = [p.data for p in self.params]  # fp32 storages, [*shape] each
        self.copies: list[torch.Tensor] = [torch.empty_like(p, dtype=dtype) for p in self.params]
        self._versions: list[int | None] = [None] * len(self.params)  # p._version at the last refresh
        self._dirty = True
        self._active = False
        self._grads: dict[int, torch.Tensor] = {}  # param index -> fp32 accumulated grad
        self._stashed: list[torch.Tensor | None] = []
        # The hooks reach this object through a weak reference: a parameter's hooks live in C++ where the
        # garbage collector cannot see them, so a strong one would make a cycle that keeps every parameter and
        # bf16 copy alive after the model, the optimizer and this object are dropped (6.9 GiB per 1B model on an
        # H200: a second setup in one process would count the first one's weights in its peak memory).
        me = weakref.ref(self)
        self._handles = [p.register_post_accumulate_grad_hook(_grad_hook(me, i)) for i, p in enumerate(self.params)]
        if optimizer is not None and hasattr(optimizer, "register_step_post_hook"):
            self._handles.append(optimizer.register_step_post_hook(_dirty_hook(me)))

    # ---- public -------------------------------------------------------------------------------------------------
    def mark_dirty(self) -> None:
        """The fp32 masters changed (optimizer step, checkpoint load): refresh every copy at the next compute()."""
        self._dirty = True

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Run forward AND backward inside: trainable params are bf16, grads accumulate in fp32 (class doc).

        Raises:
            RuntimeError: nested ``compute()`` of the same object, or a parameter whose storage was replaced
                (``p.data = ...``) since this object was built.
        """
        if self._active:
            raise RuntimeError("MasterWeights.compute() is not reentrant")
        for i, p in enumerate(self.params):
            if p.data.data_ptr() != self.masters[i].data_ptr() or p.dtype != torch.float32:
                raise RuntimeError(f"MasterWeights: parameter {self.names[i]!r} was replaced or re-cast since "
                                   "MasterWeights was built; build a new MasterWeights")
        self._refresh()
        self._stashed = [p.grad for p in self.params]
        for p, copy in zip(self.params, self.copies):
            p.grad = None  # an fp32 .grad would make autograd accumulate the bf16 grad into fp32 itself
            p.data = copy
        self._active = True
        try:
            yield
        finally:
            self._active = False
            for i, p in enumerate(self.params):
                p.grad = None  # a bf16 grad left by a backward without hooks firing (should not happen)
                p.data = self.masters[i]
                g, old = self._grads.pop(i, None), self._stashed[i]
                if g is not None and old is not None:
                    g = old.add_(g)
                p.grad = g if g is not None else old
            self._stashed = []
            self._grads.clear()

    def remove(self) -> None:
        """Remove the gradient hooks and the optimizer hook (the model stays fp32)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    # ---- internals ----------------------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Copy master -> bf16 copy for every stale parameter (all after mark_dirty, else those whose _version
        moved)."""
        idx = [i for i, p in enumerate(self.params) if self._dirty or self._versions[i] != p._version]
        if idx:
            with torch.no_grad():
                torch._foreach_copy_([self.copies[i] for i in idx], [self.masters[i] for i in idx])
            for i in idx:
                self._versions[i] = self.params[i]._version
        self._dirty = False

    def _accumulate(self, i: int, p: torch.Tensor) -> None:
        """Post-accumulate-grad hook body: move ``p.grad`` (compute dtype) into the fp32 buffer of param ``i``."""
        if not self._active or p.grad is None:
            return
        g = p.grad  # compute dtype, [*shape]
        buf = self._grads.get(i)
        if buf is None:
            self._grads[i] = g.float()
        else:
            buf.add_(g)
        p.grad = None


def _grad_hook(ref: weakref.ref, i: int):
    def hook(p: torch.Tensor) -> None:
        owner = ref()
        if owner is not None:
            owner._accumulate(i, p)
    return hook


def _dirty_hook(ref: weakref.ref):
    def hook(*_) -> None:
        owner = ref()
        if owner is not None:
            owner.mark_dirty()
    return hook


def _has_fsdp(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - older torch / no distributed
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


def precision_mode(args: Any, device: torch.device, model: nn.Module) -> tuple[str, str]:
    """Which precision the trainer runs: ``(mode, reason)`` with mode in :data:`PRECISION_MODES`.

    Reads ``bf16``, ``fp16`` (computes in bf16: no loss scaling here) and ``fp16_opt_level`` of ``args``.

    - not bf16/fp16, or ``device`` not CUDA: ``fp32`` (bf16 is only used on CUDA).
    - FSDP2 modules in ``model``: ``o2_fsdp`` at any level with ``bf16`` (``parallelize._fsdp_kwargs`` applies
      the bf16 MixedPrecisionPolicy whenever ``bf16`` is set; that is O2; autocast on top; reason set unless O2);
      ``o1`` with ``fp16`` alone (no policy then).
    - ``fp16_opt_level`` O0: ``fp32`` (Paddle's ``auto_cast(level="O0")`` casts nothing).
    - ``fp16_opt_level`` O1: ``o1`` (``torch.autocast`` bf16, fp32 parameters).
    - O2 with DTensor trainable parameters but no FSDP (tensor parallel alone): ``o1``, reason says why.
    - O2 with a trainable parameter that is not fp32: ``o1`` (no fp32 master to keep), reason says why.
    - O2 otherwise: ``o2`` (:class:`MasterWeights` around forward/backward, autocast kept).
    """
    half = bool(getattr(args, "bf16", False)) or bool(getattr(args, "fp16", False))
    if not half:
        return "fp32", ""
    if device.type != "cuda":
        asked = "bf16" if bool(getattr(args, "bf16", False)) else "fp16"
        return "fp32", f"{asked} requested but half precision is only used on CUDA (device {device})"
    level = str(getattr(args, "fp16_opt_level", "O1") or "O1").upper()
    if _has_fsdp(model):
        if not bool(getattr(args, "bf16", False)):  # _fsdp_kwargs sets its policy for bf16 only
            return "o1", "fp16 under FSDP: FSDP2's bf16 MixedPrecisionPolicy is set for bf16 only; O1 autocast"
        # parallelize._fsdp_kwargs gave every FSDP module the bf16 policy, whatever the level
        return "o2_fsdp", "" if level == "O2" else (f"fp16_opt_level {level} is not distinguished under FSDP: bf16 "
                                                     "always runs as FSDP2's MixedPrecisionPolicy (O2)")
    if level == "O0":
        return "fp32", "fp16_opt_level O0: Paddle's AMP level O0 casts nothing"
    if level != "O2":
        return "o1", ""
    trainable = _unique_trainable(model)
    if any(_is_dtensor(p) for _, p in trainable):
        return "o1", ("fp16_opt_level O2 needs plain-tensor parameters; tensor-parallel DTensor parameters without "
                      "FSDP fall back to O1 autocast")
    low = sorted({str(p.dtype) for _, p in trainable if p.dtype != torch.float32})
    if low:
        return "o1", (f"fp16_opt_level O2 keeps fp32 master weights but trainable parameters are {low}; running "
                      "O1 autocast on them (load the model in fp32 for O2)")
    return "o2", ""
