"""Resuming a Trainer run with a changed configuration: the next unseen packs are read, this run's hyperparameters
apply, and a change that alters the data order is warned naming the old and new values.

Tiny model and synthetic packs (``trainer_fixtures.py``); each test a second or two.
"""

import json
import logging
import os

import pytest

from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset


class _Recording(PackDataset):
    """PackDataset that records which pack indices the loader reads."""

    def __init__(self, n):
        super().__init__(n=n)
        self.read = []

    def __getitem__(self, i):
        self.read.append(int(i))
        return super().__getitem__(i)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("new_bs", [1, 4])
def test_resume_with_another_batch_size_reads_the_next_unseen_packs(make_args, tiny_model, tmp_path, new_bs,
                                                                     shuffle):
    # the checkpoint counts packs read (2 micro-batches of 2), not micro-batches: skipping 2 micro-batches of the
    # new size would skip 8 packs at batch size 4 (packs 4..7 never trained on) or 2 at batch size 1 (packs 2..3
    # trained on twice)
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2, dataloader_shuffle=shuffle)
    first = _Recording(16)
    Trainer(tiny_model(), make_args(per_device_train_batch_size=2, max_steps=2, **kw), train_dataset=first).train()
    assert (out / "checkpoint-2").is_dir()
    seen = list(first.read)
    assert len(seen) == 4
    second = _Recording(16)
    Trainer(tiny_model(), make_args(per_device_train_batch_size=new_bs, max_steps=3, **kw),
            train_dataset=second).train(resume_from_checkpoint=True)
    # the epoch's order is that of the first run (same seed and epoch): the next packs follow the 4 already seen
    full = _Recording(16)
    Trainer(tiny_model(), make_args(per_device_train_batch_size=8, max_steps=1, output_dir=str(tmp_path / "o2"),
                                    save_strategy="no", dataloader_shuffle=shuffle), train_dataset=full).train()
    assert full.read[:4] == seen
    assert second.read == full.read[4:4 + new_bs]


def test_resume_with_a_batch_size_that_splits_a_micro_batch_reads_its_tail_again_and_warns(make_args, tiny_model,
                                                                                            tmp_path, caplog):
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=1, dataloader_shuffle=False)
    Trainer(tiny_model(), make_args(per_device_train_batch_size=3, max_steps=1, **kw), train_dataset=_Recording(16)
            ).train()
    second = _Recording(16)
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        Trainer(tiny_model(), make_args(per_device_train_batch_size=2, max_steps=2, **kw), train_dataset=second
                ).train(resume_from_checkpoint=True)
    assert second.read == [2, 3]  # 3 packs read: one whole micro-batch of 2 kept, pack 2 read again
    assert "the last 1 are read again" in caplog.text


def test_resume_with_a_new_learning_rate_and_weight_decay_uses_them(make_args, tiny_model, tmp_path, caplog):
    # the checkpoint's optimizer param groups and LambdaLR base_lrs hold the old 1e-2 and weight_decay; PaddleNLP's
    # optimizer / scheduler states hold no such values, so there (and here) the config's values apply on resume
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2, lr_scheduler_type="linear", warmup_steps=0,
              max_steps=4)
    Trainer(tiny_model(), make_args(learning_rate=1e-2, weight_decay=0.01, **kw), train_dataset=PackDataset(n=8)
            ).train()
    t = Trainer(tiny_model(), make_args(learning_rate=1e-5, weight_decay=0.0, **kw), train_dataset=PackDataset(n=8))
    t.compute_max_steps = lambda: 3  # stop after one resumed step; the schedule still spans 4 steps
    t.create_optimizer_and_scheduler(4)
    with caplog.at_level(logging.INFO, logger="paddlenlp_ext.trainer"):
        t.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    lrs = [h["lr"] for h in t.state.log_history if "lr" in h]
    # linear decay over 4 steps, read after step 3: 1e-5 * (4 - 3) / 4
    assert lrs[-1] == pytest.approx(1e-5 * 1 / 4)
    assert [g["weight_decay"] for g in t.optimizer.param_groups] == [0.0, 0.0]
    assert "resuming with this run's learning_rate, weight_decay" in caplog.text


def test_resume_with_the_same_hyperparameters_logs_nothing(make_args, tiny_model, tmp_path, caplog):
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2, max_steps=2)
    Trainer(tiny_model(), make_args(**kw), train_dataset=PackDataset(n=8)).train()
    with caplog.at_level(logging.INFO, logger="paddlenlp_ext.trainer"):
        Trainer(tiny_model(), make_args(**{**kw, "max_steps": 3}), train_dataset=PackDataset(n=8)
                ).train(resume_from_checkpoint=True)
    assert "resuming with this run's" not in caplog.text


def test_resume_on_data_that_packs_differently_warns(make_args, tiny_model, tmp_path, caplog):
    # with another max_length (or data file) the checkpoint's "N micro-batches into epoch E" points into a
    # different list of packs: some packs are never trained on and others twice
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2)
    Trainer(tiny_model(), make_args(max_steps=2, **kw), train_dataset=PackDataset(n=16)).train()
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        Trainer(tiny_model(), make_args(max_steps=3, **kw), train_dataset=PackDataset(n=16)
                ).train(resume_from_checkpoint=True)
    assert "packs into" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        Trainer(tiny_model(), make_args(max_steps=4, **kw), train_dataset=PackDataset(n=12)
                ).train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert "the train data packs into 12 packs, the checkpoint's run had 16" in caplog.text


def test_rotation_after_resuming_an_earlier_checkpoint_keeps_the_new_one(make_args, tiny_model, tmp_path, caplog):
    # checkpoints 2, 4, 6 of a first run; resumed from checkpoint-2 with save_total_limit 1, this run writes its
    # checkpoint-4: a rotation by step alone would remove it and keep the first run's checkpoint-6 (a rerun would
    # then resume the abandoned run)
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2)
    Trainer(tiny_model(), make_args(max_steps=6, **kw), train_dataset=PackDataset(n=16)).train()
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    second = Trainer(tiny_model(), make_args(max_steps=4, save_total_limit=1, learning_rate=1e-3, **kw),
                     train_dataset=PackDataset(n=16))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        second.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert "later checkpoints of another run (checkpoint-4, checkpoint-6)" in caplog.text
    assert sorted(os.listdir(out)) == ["checkpoint-4", "checkpoint-6"]
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert losses == [h["loss"] for h in second.state.log_history if "loss" in h]  # this run's checkpoint-4


def _first_run(make_args, tiny_model, out, **kw):
    args = make_args(output_dir=str(out), save_strategy="steps", save_steps=2, max_steps=2, **kw)
    t = Trainer(tiny_model(), args, train_dataset=PackDataset(n=16))
    t.data_keys = {"max_length": 24}
    t.train()
    return out / "checkpoint-2"


def _resume(make_args, tiny_model, ckpt, caplog, data_keys=None, **kw):
    args = make_args(output_dir=str(ckpt.parent), max_steps=3, **kw)
    t = Trainer(tiny_model(), args, train_dataset=PackDataset(n=16))
    t.data_keys = {"max_length": 24} if data_keys is None else data_keys
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        t.train(resume_from_checkpoint=str(ckpt))
    return caplog.text


def test_resume_with_another_seed_warns_naming_seed_and_both_values(make_args, tiny_model, tmp_path, caplog):
    # the checkpoint's "2 micro-batches into epoch 0" are skipped in the order of the new seed, so the packs
    # skipped are not the ones trained on
    ckpt = _first_run(make_args, tiny_model, tmp_path / "out", seed=7)
    text = _resume(make_args, tiny_model, ckpt, caplog, seed=13)
    assert "seed=13 (the checkpoint's run: 7)" in text
    assert "data order" in text and "2 micro-batch(es) skipped in epoch 0" in text
    assert _resume(make_args, tiny_model, ckpt, caplog, seed=7) == ""
    # without shuffling the seed does not decide the order: nothing to warn about
    ckpt = _first_run(make_args, tiny_model, tmp_path / "noshuffle", seed=7, dataloader_shuffle=False)
    assert _resume(make_args, tiny_model, ckpt, caplog, seed=13, dataloader_shuffle=False) == ""


def test_resume_with_another_data_key_or_shuffle_warns(make_args, tiny_model, tmp_path, caplog):
    ckpt = _first_run(make_args, tiny_model, tmp_path / "out")
    text = _resume(make_args, tiny_model, ckpt, caplog, data_keys={"max_length": 32})
    assert "max_length=32 (the checkpoint's run: 24)" in text
    text = _resume(make_args, tiny_model, ckpt, caplog, dataloader_shuffle=False)
    assert "dataloader_shuffle=False (the checkpoint's run: True)" in text
    # ignore_data_skip restarts the epoch: nothing is skipped, so nothing is wrongly skipped
    assert "data order" not in _resume(make_args, tiny_model, ckpt, caplog, seed=13, ignore_data_skip=True)


def test_checkpoint_without_a_data_order_record_resumes_quietly(make_args, tiny_model, tmp_path, caplog):
    ckpt = _first_run(make_args, tiny_model, tmp_path / "out", seed=7)
    path = ckpt / "trainer_state.json"
    state = json.loads(path.read_text())
    del state["data_order"]  # a checkpoint written without the record
    path.write_text(json.dumps(state))
    assert _resume(make_args, tiny_model, ckpt, caplog, seed=13) == ""
