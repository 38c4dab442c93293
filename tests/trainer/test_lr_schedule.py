"""LR schedules: ``build_lr_scheduler`` (transformers.get_scheduler) gives PaddleNLP's formula at every step."""

import math
from types import SimpleNamespace

import pytest
import torch

from paddlenlp_ext.trainer.optimization import build_lr_scheduler, num_warmup_steps

LR = 1e-3


def paddlenlp_multiplier(schedule, step, warmup, total, num_cycles=0.5, lr_end=1e-7, power=1.0, min_lr=0.0):
    """PaddleNLP's ``paddlenlp/trainer/trainer_utils.py`` lr lambdas, written out (min_lr: the cosine floor)."""
    if schedule == "constant":
        return 1.0
    if step < warmup:
        return step / max(1, warmup)
    if schedule == "constant_with_warmup":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total - step) / max(1, total - warmup))
    if schedule == "cosine":
        progress = (step - warmup) / max(1, total - warmup)
        factor = max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))
        return factor * (1 - min_lr / LR) + min_lr / LR
    if step > total:  # polynomial
        return lr_end / LR
    pct_remaining = 1 - (step - warmup) / (total - warmup)
    return ((LR - lr_end) * pct_remaining ** power + lr_end) / LR


def _args(**kw):
    base = dict(lr_scheduler_type="linear", warmup_steps=0, warmup_ratio=0.0, num_cycles=0.5, lr_end=1e-7,
                power=1.0, min_lr=0.0, learning_rate=LR)
    base.update(kw)
    return SimpleNamespace(**base)


def _optimizer():
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=LR)


def _lrs(scheduler, steps):
    """The lr of optimizer steps 1..steps (the value the scheduler holds before each ``step()``)."""
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return out


@pytest.mark.parametrize("schedule,kw", [
    ("linear", {}), ("cosine", {}), ("cosine", {"num_cycles": 1.5}), ("cosine", {"min_lr": 1e-4}),
    ("constant", {}), ("constant_with_warmup", {}), ("polynomial", {"power": 2.0}), ("polynomial", {"lr_end": 1e-4}),
])
@pytest.mark.parametrize("warmup", [0, 3])
def test_schedule_equals_paddlenlp_formula_at_every_step(schedule, kw, warmup):
    total = 10
    sched = build_lr_scheduler(_optimizer(), _args(lr_scheduler_type=schedule, warmup_steps=warmup, **kw), total)
    got = _lrs(sched, total + 1)  # one past the end: the lr a resumed run past max_steps would hold
    want = [LR * paddlenlp_multiplier(schedule, s, warmup, total, **kw) for s in range(total + 1)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_warmup_ratio_truncates_as_paddlenlp(make_args):
    assert num_warmup_steps(make_args(warmup_steps=3, warmup_ratio=0.5), 100) == 3
    assert num_warmup_steps(make_args(warmup_steps=0, warmup_ratio=0.05), 30) == 1  # int(1.5), PaddleNLP


def test_enum_repr_schedule_name_is_accepted():
    sched = build_lr_scheduler(_optimizer(), _args(lr_scheduler_type="SchedulerType.COSINE"), 4)
    assert _lrs(sched, 3) == pytest.approx([LR * paddlenlp_multiplier("cosine", s, 0, 4) for s in range(3)])


def test_unknown_schedule_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match="lr_scheduler_type='triangle'.*linear"):
        build_lr_scheduler(_optimizer(), _args(lr_scheduler_type="triangle"), 10)


def test_polynomial_lr_end_not_below_learning_rate_is_refused():
    with pytest.raises(ValueError, match=r"lr_end \(0.001\) must be smaller than learning_rate"):
        build_lr_scheduler(_optimizer(), _args(lr_scheduler_type="polynomial", lr_end=LR), 10)


def test_polynomial_warmup_covering_all_steps_is_refused():
    with pytest.raises(ValueError, match="warmup_steps / warmup_ratio"):
        build_lr_scheduler(_optimizer(), _args(lr_scheduler_type="polynomial", warmup_steps=10), 10)


def test_scheduler_state_round_trips_through_a_checkpoint():
    """A scheduler restored from its state_dict continues with the same values as one that never stopped."""
    a = build_lr_scheduler(_optimizer(), _args(lr_scheduler_type="cosine", warmup_steps=2, min_lr=1e-5), 12)
    _lrs(a, 5)
    b = build_lr_scheduler(_optimizer(), _args(lr_scheduler_type="cosine", warmup_steps=2, min_lr=1e-5), 12)
    b.load_state_dict(a.state_dict())
    for g in b.optimizer.param_groups:
        g["lr"] = b.get_last_lr()[0]
    assert _lrs(b, 7) == pytest.approx(_lrs(a, 7), rel=1e-12)


def test_scheduler_state_of_a_plain_lambda_loads():
    """Checkpoints hold a LambdaLR state whose lambdas were plain functions (saved as None): it still loads."""
    opt = _optimizer()
    old = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 3))
    _lrs(old, 4)
    new = build_lr_scheduler(_optimizer(), _args(warmup_steps=3), 10)
    new.load_state_dict(old.state_dict())
    assert new.last_epoch == 4
    new.optimizer.step()
    new.step()
    assert new.get_last_lr()[0] == pytest.approx(LR * paddlenlp_multiplier("linear", 5, 3, 10))
