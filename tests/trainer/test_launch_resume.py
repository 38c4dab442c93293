"""``resume_target``: what the launchers do with an existing output_dir (resume, refuse, or start over)."""

import os
from types import SimpleNamespace

import pytest

from paddlenlp_ext.trainer.checkpoint import drop_previous_run
from paddlenlp_ext.trainer.launch import clear_previous_run, resume_target


def _args(out, **kw):
    base = dict(output_dir=str(out), do_train=True, overwrite_output_dir=False, resume_from_checkpoint=None)
    base.update(kw)
    return SimpleNamespace(**base)


def _ckpt(out, step):
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text("{}")
    return d


def test_resumes_latest_checkpoint(tmp_path):
    _ckpt(tmp_path, 2), _ckpt(tmp_path, 10)
    (tmp_path / "model.safetensors").write_bytes(b"x")  # a final model beside checkpoints: resume, not refuse
    assert resume_target(_args(tmp_path)) == str(tmp_path / "checkpoint-10")


def test_explicit_resume_wins(tmp_path):
    _ckpt(tmp_path, 10)
    assert resume_target(_args(tmp_path, resume_from_checkpoint="true")) == "true"


def test_fresh_dir_and_no_train(tmp_path):
    assert resume_target(_args(tmp_path / "new")) is None
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert resume_target(_args(tmp_path, do_train=False)) is None


@pytest.mark.parametrize("name", ["model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors"])
def test_refuses_to_overwrite_a_final_model_without_checkpoint(tmp_path, name):
    (tmp_path / name).write_bytes(b"x")
    with pytest.raises(ValueError, match="already holds a trained model.*overwrite_output_dir"):
        resume_target(_args(tmp_path))
    assert (tmp_path / name).exists()


def test_refuses_a_final_model_of_the_other_kind(tmp_path):
    """A full model and an adapter side by side are read differently by transformers (adapter applied) and by
    predict.py (adapter ignored): neither kind of run may add itself to the other's directory."""
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="already holds a trained model"):
        resume_target(_args(tmp_path))
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "adapter_model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="already holds a trained model"):
        resume_target(_args(tmp_path))


def test_overwrite_starts_over_and_removes_old_outputs(tmp_path):
    old = [_ckpt(tmp_path, 2), _ckpt(tmp_path, 4)]
    for name in ("model.safetensors", "config.json", "adapter_model.safetensors", "adapter_config.json",
                 "tokenizer.json", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "merged").mkdir()
    (tmp_path / "runs").mkdir()
    args = _args(tmp_path, overwrite_output_dir=True)
    assert resume_target(args) is None
    assert all(p.exists() for p in old) and (tmp_path / "model.safetensors").exists()  # nothing removed yet
    clear_previous_run(args)  # the launchers call it once the model and data have loaded
    assert not any(p.exists() for p in old)
    # moved aside, not deleted, until the new run saves; the tokenizer and user files stay
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "previous_run", "tokenizer.json"]
    kept = tmp_path / "previous_run"
    assert sorted(os.listdir(kept)) == ["adapter_config.json", "adapter_model.safetensors", "checkpoint-2",
                                        "checkpoint-4", "config.json", "merged", "model.safetensors", "runs"]
    with pytest.raises(ValueError, match="holds previous_run/"):  # nothing to resume, and a plain run would
        resume_target(_args(tmp_path))  # delete the replaced model at its first save
    drop_previous_run(tmp_path)  # the Trainer, after the new run's first save
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "tokenizer.json"]


def test_overwrite_after_an_unsaved_overwrite_keeps_the_saved_run(tmp_path):
    """A second overwrite after a run that died before saving: previous_run/ still holds the last saved run
    (kept); the dead run's files at the top level are what gets removed."""
    (tmp_path / "model.safetensors").write_bytes(b"old")
    args = _args(tmp_path, overwrite_output_dir=True)
    clear_previous_run(args)
    (tmp_path / "runs").mkdir()  # the run that died wrote its TensorBoard dir, then nothing
    clear_previous_run(args)
    assert sorted(os.listdir(tmp_path)) == ["previous_run"]
    assert (tmp_path / "previous_run" / "model.safetensors").read_bytes() == b"old"


def test_overwrite_refuses_the_model_directory_itself(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="model directory being fine-tuned"):
        resume_target(_args(tmp_path, overwrite_output_dir=True), model_path=str(tmp_path))
    assert (tmp_path / "model.safetensors").exists()
