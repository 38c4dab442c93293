"""Checkpoints: resume reproduces the uninterrupted run, atomic writes, rotation, contents."""

import json
import os

import pytest
import torch

from paddlenlp_ext.trainer import checkpoint as ckpt
from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset

# 7 packs, bs 2 -> 4 micro-batches per epoch (last one has 1 pack); gas 2 -> the run crosses epochs mid-step
DS_KW = dict(n=7)


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _run(make_args, tiny_model, out, max_steps, resume=None, **kw):
    args = make_args(output_dir=str(out), max_steps=6, save_steps=3, save_strategy="steps",
                     gradient_accumulation_steps=2, **kw)
    t = Trainer(tiny_model(), args, train_dataset=PackDataset(**DS_KW))
    t.compute_max_steps = lambda: max_steps  # stop early while the schedule still spans 6 steps
    if max_steps != 6:
        t.create_optimizer_and_scheduler(6)
    t.train(resume_from_checkpoint=resume)
    return t


def test_resume_equals_uninterrupted(make_args, tiny_model, tmp_path):
    full = _run(make_args, tiny_model, tmp_path / "full", 6)
    first = _run(make_args, tiny_model, tmp_path / "split", 3)
    assert (tmp_path / "split" / "checkpoint-3").is_dir()
    second = _run(make_args, tiny_model, tmp_path / "split", 6, resume=True)
    assert second.state.global_step == 6
    resumed = _losses(first) + _losses(second)[3:]
    assert _losses(second)[:3] == _losses(first)  # history restored from trainer_state.json
    assert resumed == _losses(full)  # CPU fp32, same op order: bitwise equal
    for (n, a), (_, b) in zip(full.model.named_parameters(), second.model.named_parameters()):
        assert torch.equal(a, b), n


def test_resume_from_explicit_path_and_shuffle_epochs(make_args, tiny_model, tmp_path):
    full = _run(make_args, tiny_model, tmp_path / "full", 6, dataloader_shuffle=True)
    _run(make_args, tiny_model, tmp_path / "split", 3, dataloader_shuffle=True)
    second = _run(make_args, tiny_model, tmp_path / "split", 6, resume=str(tmp_path / "split" / "checkpoint-3"),
                  dataloader_shuffle=True)
    assert _losses(second) == _losses(full)
    assert full.state.epoch >= 2  # 12 micro-batches over 4 per epoch: the epoch boundary was crossed


def test_checkpoint_contents(make_args, tiny_model, tmp_path):
    t = _run(make_args, tiny_model, tmp_path / "o", 3)
    path = tmp_path / "o" / "checkpoint-3"
    names = set(os.listdir(path))
    assert {"distcp", "scheduler.pt", "trainer_state.json", "rng_state_0.pth", "data_state_0.pt"} <= names
    assert any(n.endswith(".distcp") for n in os.listdir(path / "distcp"))
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and len(state["log_history"]) == 3
    data = torch.load(path / "data_state_0.pt")
    assert data == {"epoch": 1, "micro_batches_in_epoch": 2}  # 6 micro-batches consumed, 4 per epoch
    rng = torch.load(path / "rng_state_0.pth", weights_only=False)
    assert {"python", "numpy", "cpu"} <= set(rng)
    assert torch.load(path / "scheduler.pt")["last_epoch"] == 3
    # model and optimizer (exp_avg, exp_avg_sq, step) round-trip through DCP into fresh objects
    fresh = Trainer(tiny_model(seed=123), t.args, train_dataset=PackDataset(**DS_KW))
    fresh.create_optimizer_and_scheduler(6)
    fresh._load_checkpoint(path)
    for (n, a), (_, b) in zip(t.model.named_parameters(), fresh.model.named_parameters()):
        assert torch.equal(a, b), n
    for pa, pb in zip(t.model.parameters(), fresh.model.parameters()):
        sa, sb = t.optimizer.state[pa], fresh.optimizer.state[pb]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
        assert float(sa["step"]) == float(sb["step"]) == 3
    assert fresh.lr_scheduler.get_last_lr() == t.lr_scheduler.get_last_lr()


def test_failed_save_leaves_previous_checkpoints(make_args, tiny_model, tmp_path, monkeypatch):
    t = _run(make_args, tiny_model, tmp_path / "o", 3)
    before = sorted(os.listdir(tmp_path / "o" / "checkpoint-3"))

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ckpt, "_rng_state", boom)  # fails after DCP wrote model/optimizer into the tmp dir
    t.state.global_step = 4
    with pytest.raises(RuntimeError, match="disk full"):
        t.save_checkpoint()
    entries = sorted(os.listdir(tmp_path / "o"))
    assert "checkpoint-4" not in entries and "checkpoint-4.tmp" not in entries
    assert sorted(os.listdir(tmp_path / "o" / "checkpoint-3")) == before
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "o")] == ["checkpoint-3"]


def test_stale_tmp_dir_is_ignored_and_replaced(make_args, tiny_model, tmp_path):
    out = tmp_path / "o"
    (out / "checkpoint-9.tmp").mkdir(parents=True)  # a crash left this behind
    assert ckpt.list_checkpoints(out) == []
    with pytest.raises(ValueError, match="no checkpoint"):
        ckpt.resolve_resume_path(True, out)
    t = _run(make_args, tiny_model, out, 3)
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["checkpoint-3"]
    assert t.state.global_step == 3


def test_save_total_limit_rotation(make_args, tiny_model, tmp_path):
    args = make_args(output_dir=str(tmp_path / "o"), max_steps=5, save_steps=1, save_strategy="steps",
                     save_total_limit=2)
    Trainer(tiny_model(), args, train_dataset=PackDataset(8)).train()
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "o")] == ["checkpoint-4", "checkpoint-5"]


def test_bad_resume_path(tmp_path):
    with pytest.raises(ValueError, match="trainer_state.json"):
        ckpt.resolve_resume_path(str(tmp_path), tmp_path)


class _Stream(torch.utils.data.IterableDataset):
    """Iterable view of the packs (like ZeroPaddingIterableDataset with lazy=true): no __len__."""

    def __init__(self, n):
        self.ds = PackDataset(n)

    def __iter__(self):
        return iter(self.ds.items)


def test_iterable_dataset_resume_equals_uninterrupted(make_args, tiny_model, tmp_path):
    def run(out, stop, resume=None):
        args = make_args(output_dir=str(out), max_steps=6, save_steps=3, save_strategy="steps",
                         gradient_accumulation_steps=2)
        t = Trainer(tiny_model(), args, train_dataset=_Stream(7))
        t.compute_max_steps = lambda: stop
        t.create_optimizer_and_scheduler(6)
        t.train(resume_from_checkpoint=resume)
        return t

    full = run(tmp_path / "full", 6)
    run(tmp_path / "split", 3)
    second = run(tmp_path / "split", 6, resume=True)
    assert _losses(second) == _losses(full)
    # 12 micro-batches, 4 per pass: the third pass is fully consumed (the epoch rolls over on the next fetch)
    assert (full.state.epoch, full.state.micro_batches_in_epoch) == (2, 4)


def test_iterable_dataset_needs_max_steps(make_args, tiny_model):
    t = Trainer(tiny_model(), make_args(max_steps=-1, num_train_epochs=1), train_dataset=_Stream(4))
    with pytest.raises(ValueError, match="max_steps must be > 0"):
        t.train()


def test_resume_refuses_a_checkpoint_of_another_trainer(make_args, tiny_model, tmp_path):
    """Same parameter shapes would load (an SFT checkpoint resumed by DPO): trainer_state.json names the Trainer
    class that wrote it, and another class refuses it before loading anything."""
    class OtherTrainer(Trainer):
        pass

    args = make_args(max_steps=2, save_strategy="steps", save_steps=2)
    OtherTrainer(tiny_model(), args, train_dataset=PackDataset(8)).train()
    path = tmp_path / "out" / "checkpoint-2"
    assert json.loads((path / ckpt.TRAINER_STATE).read_text())["trainer"] == "OtherTrainer"
    t = Trainer(tiny_model(), make_args(max_steps=4), train_dataset=PackDataset(8))
    with pytest.raises(ValueError, match="written by OtherTrainer, not Trainer"):
        t.train(resume_from_checkpoint=str(path))
    OtherTrainer(tiny_model(), make_args(max_steps=4), train_dataset=PackDataset(8)).train(
        resume_from_checkpoint=str(path))  # its own kind resumes


def test_resume_with_another_max_steps_records_this_runs(make_args, tiny_model, tmp_path):
    """After a resume under another max_steps, trainer_state.json holds this run's max_steps (checkpoint-3 of a
    resumed --max_steps 3 run says 3, not the first run's 4)."""
    _run(make_args, tiny_model, tmp_path / "o", 3)
    assert json.loads((tmp_path / "o" / "checkpoint-3" / "trainer_state.json").read_text())["max_steps"] == 3
    second = _run(make_args, tiny_model, tmp_path / "o", 6, resume=True)
    assert second.state.max_steps == 6
    assert json.loads((tmp_path / "o" / "checkpoint-6" / "trainer_state.json").read_text())["max_steps"] == 6
