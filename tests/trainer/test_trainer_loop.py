"""Trainer loop: gradient-accumulation equivalence, the LR the loop follows, evaluation and save at epoch ends,
TensorBoard output, and the messages for a step that spans epochs or a dataset that yields no batch."""

import glob
import logging
import os

import pytest
import torch
import torch.nn.functional as F

from paddlenlp_ext.trainer.optimization import build_optimizer
from paddlenlp_ext.trainer.trainer import Trainer

from trainer_fixtures import PackDataset


def _collate(items):
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_accumulation_equals_big_batch(make_args, tiny_model):
    """4 micro-batches of 1 pack == 1 batch of 4 packs: same loss (global token mean) and same gradients."""
    ds = PackDataset(4)
    packs = [ds[i] for i in range(4)]
    t_small = Trainer(tiny_model(), make_args(gradient_accumulation_steps=4, per_device_train_batch_size=1))
    t_big = Trainer(tiny_model(), make_args(per_device_train_batch_size=4))
    out_small = t_small.forward_backward([_collate([p]) for p in packs])
    out_big = t_big.forward_backward([_collate(packs)])

    big = _collate(packs)
    logits = t_big.model(big["input_ids"], big["position_ids"], big["attn_mask_startend_row_indices"])
    expected = F.cross_entropy(logits.flatten(0, 1), big["labels"].flatten(), ignore_index=-100)  # token mean
    loss_small = out_small["loss_sum"] / out_small["count"]
    loss_big = out_big["loss_sum"] / out_big["count"]
    assert out_small["count"].item() == out_big["count"].item() == (big["labels"] != -100).sum().item()
    # fp32 sums in a different order: a few ulps of the ~3.5 loss
    torch.testing.assert_close(loss_small, expected.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss_big, expected.detach(), rtol=1e-6, atol=1e-6)
    g_small, g_big = _grads(t_small.model), _grads(t_big.model)
    for name in g_big:
        torch.testing.assert_close(g_small[name], g_big[name], rtol=1e-5, atol=1e-7, msg=name)
    # packs hold different numbers of label tokens, so a mean of per-micro-batch means would differ
    per_mb = torch.stack([F.cross_entropy(t_big.model(**{k: _collate([p])[k] for k in
                                                          ("input_ids", "position_ids")}).flatten(0, 1),
                                          p["labels"], ignore_index=-100) for p in packs]).mean()
    assert abs(per_mb.item() - expected.item()) > 1e-4


def test_accumulated_training_matches_big_batch_training(make_args, tiny_model):
    """Whole runs: gas=4 x bs=1 and gas=1 x bs=4 log the same losses for 4 steps."""
    ds = PackDataset(16)
    a = Trainer(tiny_model(), make_args(gradient_accumulation_steps=4, per_device_train_batch_size=1, max_steps=4),
                train_dataset=ds)
    b = Trainer(tiny_model(), make_args(per_device_train_batch_size=4, max_steps=4), train_dataset=ds)
    a.train()
    b.train()
    la = [h["loss"] for h in a.state.log_history]
    lb = [h["loss"] for h in b.state.log_history]
    assert len(la) == 4
    assert la == pytest.approx(lb, rel=1e-5, abs=1e-6)


def test_trainer_lr_follows_schedule(make_args, tiny_model):
    t = Trainer(tiny_model(), make_args(max_steps=5, warmup_steps=2, learning_rate=1e-2), train_dataset=PackDataset(8))
    t.train()
    # logged after scheduler.step() (as PaddleNLP): the lr the next step will use; step 1 ran at lr 0
    lrs = [h["lr"] for h in t.state.log_history]
    assert lrs == pytest.approx([1e-2 * f for f in (0.5, 1.0, 2 / 3, 1 / 3, 0.0)], abs=1e-12)


def test_no_weight_decay_on_norms_and_biases(make_args, tiny_model):
    opt = build_optimizer(tiny_model(), make_args(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"])
    assert len(no_decay["params"]) == 3  # mlp.bias, norm.weight, norm.bias


def test_loss_falls_and_evaluate(make_args, tiny_model):
    ds = PackDataset(8)
    t = Trainer(tiny_model(), make_args(max_steps=20, learning_rate=3e-2), train_dataset=ds, eval_dataset=ds)
    before = t.evaluate()["eval_loss"]
    t.train()
    after = t.evaluate()["eval_loss"]
    assert after < before - 0.5
    # eval loss is the global token mean over the dev packs
    batch = _collate([ds[i] for i in range(len(ds))])
    with torch.no_grad():
        logits = t.model(batch["input_ids"], batch["position_ids"])
    ref = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100).item()
    assert after == pytest.approx(ref, rel=1e-5)


def test_epochs_give_max_steps_and_eval_per_epoch(make_args, tiny_model):
    ds = PackDataset(10)  # bs 2 -> 5 micro-batches per epoch; gas 2 -> ceil(2 * 5 / 2) = 5 steps
    t = Trainer(tiny_model(), make_args(max_steps=-1, num_train_epochs=2, gradient_accumulation_steps=2,
                                        evaluation_strategy="epoch"), train_dataset=ds, eval_dataset=ds)
    calls = []
    orig = t.evaluate
    t.evaluate = lambda *a, **k: calls.append(t.state.global_step) or orig(*a, **k)
    t.train()
    assert t.state.global_step == 5
    assert calls == [3, 5]  # epoch 0 ends inside step 3 (micro-batches 5, 6); step 5 ends epoch 1


def test_tensorboard_event_file(make_args, tiny_model, tmp_path):
    args = make_args(max_steps=3, report_to=["tensorboard"])
    Trainer(tiny_model(), args, train_dataset=PackDataset(8)).train()
    events = glob.glob(str(tmp_path / "out" / "runs" / "events.out.tfevents.*"))
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(events[0])
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3]
    assert "train/lr" in acc.Tags()["scalars"] and "train/tokens_per_sec" in acc.Tags()["scalars"]


def test_evaluation_strategy_steps(make_args, tiny_model):
    ds = PackDataset(8)
    t = Trainer(tiny_model(), make_args(max_steps=5, evaluation_strategy="steps", eval_steps=2), train_dataset=ds,
                eval_dataset=ds)
    t.train()
    evals = [(h["step"], h["eval_loss"]) for h in t.state.log_history if "eval_loss" in h]
    assert [s for s, _ in evals] == [2, 4]
    assert t.last_eval[0] == 4 and t.last_eval[1]["eval_loss"] == evals[-1][1]
    assert [h["step"] for h in t.state.log_history if "loss" in h] == [1, 2, 3, 4, 5]


def test_trainer_publishes_step_and_replica_rank(make_args, tiny_model, monkeypatch):
    """Each step runs with TRAINER_GLOBAL_STEP = the step about to run (PaddleNLP's convention; ERNIE's random
    position ids are seeded with it), and modules with a ``replica_rank`` get the data-parallel rank."""
    import os

    model = tiny_model()
    model.replica_rank = 7
    trainer = Trainer(model, make_args(max_steps=3), train_dataset=PackDataset(4), data_collator=_collate)
    assert model.replica_rank == 0  # one process: data-parallel rank 0
    seen = []
    real_step = trainer.training_step
    monkeypatch.setattr(trainer, "training_step",
                        lambda micro: (seen.append(os.environ["TRAINER_GLOBAL_STEP"]), real_step(micro))[1])
    trainer.train()
    assert seen == ["0", "1", "2"]


def test_window_clock_excludes_mid_window_eval_and_save(make_args, tiny_model):
    """tokens/s and train_runtime count every step of a window, and no eval or checkpoint time, also when the
    eval and the save fall inside a logging window (a clock restarted there would drop the window's earlier steps
    from the time but not from the tokens). Bounds are from measured intervals, not guesses:
    sum(step times) <= train_runtime <= wall time of train() - sum(pause times)."""
    import time

    ds = PackDataset(8)
    t = Trainer(tiny_model(), make_args(max_steps=4, logging_steps=4, evaluation_strategy="steps", eval_steps=2,
                                        save_strategy="steps", save_steps=3), train_dataset=ds, eval_dataset=ds)
    steps, pauses = [], []

    def timed(fn, into, sleep_s):
        def run(*a, **k):
            t0 = time.perf_counter()
            time.sleep(sleep_s)  # make each interval long enough to matter
            out = fn(*a, **k)
            into.append(time.perf_counter() - t0)
            return out
        return run

    t.training_step = timed(t.training_step, steps, 0.1)
    t.evaluate = timed(t.evaluate, pauses, 0.3)
    t.save_checkpoint = timed(t.save_checkpoint, pauses, 0.3)
    wall0 = time.perf_counter()
    out = t.train()
    wall = time.perf_counter() - wall0
    # one window of 4 steps, with an eval after step 2 and a save after step 3 inside it
    assert [h["step"] for h in t.state.log_history if "tokens_per_sec" in h] == [4]
    assert len(steps) == 4 and len(pauses) >= 2  # (the eval at step 4 also runs, after the window closed)
    assert sum(steps) <= out["train_runtime"] <= wall - sum(pauses)
    window = next(h for h in t.state.log_history if "tokens_per_sec" in h)
    assert window["tokens_per_sec"] == pytest.approx(out["tokens_per_sec"], rel=1e-9)


def test_step_spanning_several_epochs_warns_once(make_args, tiny_model, caplog):
    # gradient_accumulation_steps x batch > packs: the step repeats packs, said once (else the log shows only
    # epoch: 4 after one step of num_train_epochs 1)
    t = Trainer(tiny_model(), make_args(gradient_accumulation_steps=4, per_device_train_batch_size=1, max_steps=1),
                train_dataset=PackDataset(2))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        t.train()
    msgs = [r.getMessage() for r in caplog.records if "repeats" in r.getMessage()]
    assert len(msgs) == 1 and "gradient_accumulation_steps=4" in msgs[0] and "2 micro-batch" in msgs[0], msgs


def test_no_epoch_warning_when_an_epoch_covers_a_step(make_args, tiny_model, caplog):
    t = Trainer(tiny_model(), make_args(gradient_accumulation_steps=2, per_device_train_batch_size=1, max_steps=1),
                train_dataset=PackDataset(2))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        t.train()
    assert not [r for r in caplog.records if "repeats" in r.getMessage()]


def test_epoch_strategy_evaluates_and_saves_at_the_step_that_ends_the_epoch(make_args, tiny_model, tmp_path):
    # the epoch ends at the step whose last micro-batch ends it, not when the next epoch's first one is drawn (else
    # checkpoint-<k> and the epoch's eval would hold a step of the next epoch)
    ds = PackDataset(4)  # bs 2 -> 2 micro-batches per epoch; gas 1 -> epochs end after steps 2, 4, 6
    t = Trainer(tiny_model(), make_args(max_steps=-1, num_train_epochs=3, evaluation_strategy="epoch",
                                        save_strategy="epoch"), train_dataset=ds, eval_dataset=ds)
    calls = []
    orig = t.evaluate
    t.evaluate = lambda *a, **k: calls.append(t.state.global_step) or orig(*a, **k)
    t.train()
    assert t.state.global_step == 6 and calls == [2, 4, 6]
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_tensorboard_eval_tags_are_eval_slash_metric(make_args, tiny_model, tmp_path):
    # HF and PaddleNLP's rewrite_logs write eval/loss next to train/loss (not eval/eval_loss)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = make_args(max_steps=2, report_to=["tensorboard"], evaluation_strategy="steps", eval_steps=2)
    Trainer(tiny_model(), args, train_dataset=PackDataset(n=4), eval_dataset=PackDataset(n=2, seed=1)).train()
    events = glob.glob(os.path.join(args.output_dir, "runs", "events.out.tfevents.*"))
    acc = EventAccumulator(events[0])
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "eval/loss" in tags and "train/loss" in tags
    assert not [t for t in tags if t.startswith("eval/eval_")]


def test_no_train_batch_error_names_the_counts_and_the_keys(make_args, tiny_model):
    # the counts, the key that causes it here (dataloader_drop_last) and the fixes
    args = make_args(per_device_train_batch_size=8, dataloader_drop_last=True, max_steps=1)
    with pytest.raises(ValueError, match=r"3 pack\(s\) for 1 rank\(s\) x per_device_train_batch_size=8 with "
                                         r"dataloader_drop_last=true\); lower per_device_train_batch_size, set "
                                         r"dataloader_drop_last false"):
        Trainer(tiny_model(), args, train_dataset=PackDataset(n=3)).train()
