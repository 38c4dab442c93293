"""Resume safety: a resumed step trains at this run's learning-rate schedule, and a checkpoint's pickles are
loaded as plain data (one that asks for anything else is refused before anything is loaded)."""

import logging
import os

import numpy as np
import pytest
import torch

from paddlenlp_ext.trainer import checkpoint as ckpt
from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset


def _train(make_args, tiny_model, out, max_steps, lrs=None, resume=None):
    args = make_args(output_dir=str(out), max_steps=max_steps, save_strategy="steps", save_steps=3, warmup_steps=2,
                     learning_rate=5e-3, lr_scheduler_type="cosine")
    t = Trainer(tiny_model(), args, train_dataset=PackDataset(8))
    t.create_optimizer_and_scheduler(max_steps)
    if lrs is not None:  # the rate each training step applies (a hook on the optimizer would also see the
        step = t.optimizer_step  # lr-0 step DCP's set_state_dict takes to create the AdamW states)

        def record():
            lrs.append(t.optimizer.param_groups[0]["lr"])
            return step()
        t.optimizer_step = record
    t.train(resume_from_checkpoint=resume)
    return t


def test_rerun_with_larger_max_steps_trains_at_the_current_schedule(make_args, tiny_model, tmp_path, caplog):
    straight = []
    _train(make_args, tiny_model, tmp_path / "straight", 6, lrs=straight)
    first = []
    _train(make_args, tiny_model, tmp_path / "o", 3, lrs=first)
    resumed = []
    with caplog.at_level(logging.INFO, logger="paddlenlp_ext.trainer"):
        _train(make_args, tiny_model, tmp_path / "o", 6, lrs=resumed, resume=True)
    # step 4 trained at lr 0 (where the finished 3-step cosine ended) before: it changed nothing
    assert len(resumed) == 3 and resumed[0] > 1e-3
    assert resumed == pytest.approx(straight[3:], rel=1e-9)
    assert any("schedule changed on resume" in r.getMessage() and "step 4" in r.getMessage() for r in caplog.records)


def test_resume_under_the_same_schedule_logs_nothing(make_args, tiny_model, tmp_path, caplog):
    args = make_args(output_dir=str(tmp_path / "o"), max_steps=6, save_strategy="steps", save_steps=3)
    t = Trainer(tiny_model(), args, train_dataset=PackDataset(8))
    t.compute_max_steps = lambda: 3  # stop at 3 under the 6-step schedule
    t.create_optimizer_and_scheduler(6)
    t.train()
    with caplog.at_level(logging.INFO, logger="paddlenlp_ext.trainer"):
        Trainer(tiny_model(), args, train_dataset=PackDataset(8)).train(resume_from_checkpoint=True)
    assert not any("schedule changed" in r.getMessage() for r in caplog.records)


class _RunsCode:
    """Unpickling calls ``open(marker, "w")``: what a crafted checkpoint could do with ``os.system``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def saved(make_args, tiny_model, tmp_path):
    args = make_args(output_dir=str(tmp_path / "o"), max_steps=2, save_strategy="steps", save_steps=2)
    Trainer(tiny_model(), args, train_dataset=PackDataset(8)).train()
    return args, tmp_path / "o" / "checkpoint-2"


@pytest.mark.parametrize("name", ["scheduler.pt", "rng_state_0.pth", "data_state_0.pt"])
def test_a_pickle_that_would_run_code_is_refused(saved, tiny_model, tmp_path, name):
    args, path = saved
    marker = tmp_path / "ran"
    torch.save({"epoch": 0, "micro_batches_in_epoch": 0, "x": _RunsCode(str(marker))}, path / name)
    t = Trainer(tiny_model(seed=5), args, train_dataset=PackDataset(8))
    before = [p.detach().clone() for p in t.model.parameters()]
    with pytest.raises(ValueError, match=rf"refusing to load .*{name}: its pickle asks for (io|builtins).open"):
        t.train(resume_from_checkpoint=str(path))
    assert not marker.exists()
    assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters()))  # refused before any load


def test_a_dcp_metadata_that_would_run_code_is_refused(saved, tiny_model, tmp_path):
    import pickle

    args, path = saved
    marker = tmp_path / "ran"
    (path / "distcp" / ".metadata").write_bytes(pickle.dumps(_RunsCode(str(marker))))
    t = Trainer(tiny_model(), args, train_dataset=PackDataset(8))
    with pytest.raises(ValueError, match=r"refusing to load .*\.metadata: its pickle asks for (io|builtins).open"):
        t.train(resume_from_checkpoint=str(path))
    assert not marker.exists()


def test_plain_checkpoint_pickles_load_with_numpy_rng_state(saved):
    _, path = saved
    rng = ckpt.load_plain_pickle(path / "rng_state_0.pth")
    assert isinstance(rng["numpy"][1], np.ndarray) and rng["numpy"][1].dtype == np.uint32
    assert ckpt.load_plain_pickle(path / "data_state_0.pt") == {"epoch": 0, "micro_batches_in_epoch": 2}
    assert ckpt.load_plain_pickle(path / "scheduler.pt")["last_epoch"] == 2
    assert os.path.isfile(path / "distcp" / ".metadata")
    ckpt.check_dcp_metadata(path / "distcp")  # DCP's own metadata passes
