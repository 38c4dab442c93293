"""AdamW with PaddleNLP's weight-decay rule and the learning-rate schedules with warmup.

Matches ``paddlenlp/trainer/trainer.py`` (``create_optimizer``: no decay on parameters whose name contains
"bias" or "norm") and ``paddlenlp/transformers/optimization.py`` (``get_*_schedule_with_warmup``;
``warmup_steps > 0`` overrides ``warmup_ratio``, and the ratio is truncated with ``int()`` as PaddleNLP does).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

SCHEDULES = ("linear", "cosine", "constant", "constant_with_warmup", "polynomial")


def build_optimizer(model: torch.nn.Module, args) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``model``, in two groups (decay / no decay).

    Parameters with fewer than 2 dims, or whose name contains "bias" or "norm", get ``weight_decay=0``
    (PaddleNLP: ``decay_parameters`` excludes "bias" and "norm"). States are kept in the parameters' dtype;
    the trainer keeps parameters in fp32 outside forward/backward (bf16 is applied by autocast, or by
    ``MasterWeights`` under O2), so the states are fp32. ``fused=True`` (one multi-tensor kernel) when every
    trainable parameter is a CUDA plain tensor; otherwise torch's default (``foreach`` on CUDA, DTensors, CPU).

    Args read: ``learning_rate``, ``weight_decay``, ``adam_beta1``, ``adam_beta2``, ``adam_epsilon``.
    Raises ValueError if the model has no trainable parameter.
    """
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        lowered = name.lower()
        (no_decay if p.ndim < 2 or "bias" in lowered or "norm" in lowered else decay).append(p)
    if not decay and not no_decay:
        raise ValueError("the model has no parameter with requires_grad=True; nothing to train "
                         "(check the LoRA / freezing settings)")
    groups = [{"params": decay, "weight_decay": float(args.weight_decay)},
              {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    fused = all(_plain_cuda(p) for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=float(args.learning_rate),
                             betas=(float(args.adam_beta1), float(args.adam_beta2)),
                             eps=float(args.adam_epsilon), fused=True if fused else None)


def _plain_cuda(p: torch.Tensor) -> bool:
    """A CUDA floating-point tensor that is not a DTensor / other subclass (fused AdamW takes only those)."""
    return type(p.data) is torch.Tensor and p.is_cuda and p.is_floating_point()


def num_warmup_steps(args, max_steps: int) -> int:
    """``warmup_steps`` when > 0, else ``int(warmup_ratio * max_steps)`` (PaddleNLP's rule)."""
    if getattr(args, "warmup_steps", 0) and args.warmup_steps > 0:
        return int(args.warmup_steps)
    return int(float(getattr(args, "warmup_ratio", 0.0) or 0.0) * max_steps)


def lr_lambda(schedule: str, warmup: int, total: int, *, num_cycles: float = 0.5, lr_end: float = 1e-7,
              power: float = 1.0, base_lr: float = 1.0, min_lr: float = 0.0) -> Callable[[int], float]:
    """Multiplier of the base learning rate at optimizer step ``step`` (0-based: the lr used by step ``step+1``).

    - linear: ``step/warmup`` then linear decay to 0 at ``total``.
    - cosine: warmup, then ``0.5*(1+cos(pi*2*num_cycles*progress))``, floored at ``min_lr/base_lr``.
    - constant: 1 (warmup ignored, as PaddleNLP's ``get_constant_schedule``).
    - constant_with_warmup: warmup then 1.
    - polynomial: warmup, then ``(lr - lr_end)*(1-progress)**power + lr_end`` (HF/PaddleNLP formula).
    Raises ValueError on an unknown schedule name.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_scheduler_type={schedule!r} is not supported; use one of {SCHEDULES}")
    total = max(int(total), 1)

    def warm(step: int) -> float | None:
        return step / max(1, warmup) if step < warmup else None

    def fn(step: int) -> float:
        if schedule == "constant":
            return 1.0
        w = warm(step)
        if w is not None:
            return w
        if schedule == "constant_with_warmup":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        if schedule == "cosine":
            factor = max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))
            floor = min_lr / base_lr if base_lr > 0 else 0.0
            return floor + (1.0 - floor) * factor
        # polynomial
        if lr_end > base_lr:
            raise ValueError(f"lr_end ({lr_end}) must be <= learning_rate ({base_lr})")
        return ((base_lr - lr_end) * (1.0 - progress) ** power + lr_end) / base_lr

    return fn


def build_lr_scheduler(optimizer: torch.optim.Optimizer, args, max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` for ``args.lr_scheduler_type`` over ``max_steps`` optimizer steps.

    Args read: ``lr_scheduler_type``, ``warmup_steps``, ``warmup_ratio``, ``num_cycles``, ``lr_end``, ``power``,
    ``min_lr``, ``learning_rate``. Raises ValueError on an unknown schedule.
    """
    schedule = str(getattr(args, "lr_scheduler_type", "linear"))
    schedule = schedule.split(".")[-1].lower()  # tolerate enum reprs such as "SchedulerType.LINEAR"
    fn = lr_lambda(schedule, num_warmup_steps(args, max_steps), max_steps,
                   num_cycles=float(getattr(args, "num_cycles", 0.5)),
                   lr_end=float(getattr(args, "lr_end", 1e-7)),
                   power=float(getattr(args, "power", 1.0)),
                   base_lr=float(args.learning_rate),
                   min_lr=float(getattr(args, "min_lr", 0.0) or 0.0))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
