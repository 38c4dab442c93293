"""AdamW with PaddleNLP's weight-decay rule and the learning-rate schedules with warmup.

Matches ``paddlenlp/trainer/trainer.py`` (``create_optimizer``: no decay on parameters whose name contains
"bias" or "norm") and ``paddlenlp/trainer/trainer_utils.py`` (``get_scheduler``: the schedules come from
``transformers.get_scheduler``, the same formulas; ``warmup_steps > 0`` overrides ``warmup_ratio``, and the ratio is
truncated with ``int()`` as PaddleNLP does).
"""

from __future__ import annotations

import torch
from transformers import get_scheduler

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


def build_lr_scheduler(optimizer: torch.optim.Optimizer, args, max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``transformers.get_scheduler`` for ``args.lr_scheduler_type`` over ``max_steps`` optimizer steps.

    PaddleNLP's ``get_*_schedule_with_warmup`` are Hugging Face's formulas (the multiplier at optimizer step ``s``,
    0-based: the lr used by step ``s+1``), so the library builds them; ``tests/trainer/test_lr_schedule.py`` checks
    every value against PaddleNLP's formula. ``constant`` ignores warmup (PaddleNLP's ``get_constant_schedule``);
    ``min_lr > 0`` floors the cosine (``cosine_with_min_lr``).

    Args read: ``lr_scheduler_type``, ``warmup_steps``, ``warmup_ratio``, ``num_cycles``, ``lr_end``, ``power``,
    ``min_lr``, ``learning_rate``.
    Raises ValueError: an unknown schedule; ``polynomial`` with ``lr_end >= learning_rate`` (PaddleNLP's rule) or
    with warmup covering every step (its decay would divide by zero at the last step).
    """
    schedule = str(getattr(args, "lr_scheduler_type", "linear"))
    schedule = schedule.split(".")[-1].lower()  # tolerate enum reprs such as "SchedulerType.LINEAR"
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_scheduler_type={schedule!r} is not supported; use one of {SCHEDULES}")
    warmup = num_warmup_steps(args, max_steps)
    total = max(int(max_steps), 1)
    lr = float(args.learning_rate)
    kwargs: dict = {}
    if schedule == "cosine":
        kwargs["num_cycles"] = float(getattr(args, "num_cycles", 0.5))
        min_lr = float(getattr(args, "min_lr", 0.0) or 0.0)
        if min_lr > 0 and lr > 0:
            schedule = "cosine_with_min_lr"
            kwargs["min_lr_rate"] = min_lr / lr
    elif schedule == "polynomial":
        lr_end = float(getattr(args, "lr_end", 1e-7))
        if not lr > lr_end:
            raise ValueError(f"lr_end ({lr_end}) must be smaller than learning_rate ({lr}) for lr_scheduler_type "
                             "polynomial (PaddleNLP's rule): lower lr_end")
        if warmup == total:
            raise ValueError(f"lr_scheduler_type polynomial: warmup ({warmup} steps) covers all max_steps ({total}), "
                             "leaving no step to decay over; lower warmup_steps / warmup_ratio")
        kwargs.update(lr_end=lr_end, power=float(getattr(args, "power", 1.0)))
    return get_scheduler(schedule, optimizer, num_warmup_steps=warmup, num_training_steps=total,
                         scheduler_specific_kwargs=kwargs or None)
