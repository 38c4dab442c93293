"""``resume_target``: what the launchers do with an existing output_dir (resume, refuse, or start over)."""

import os
from types import SimpleNamespace

import pytest

from paddlenlp_ext.trainer.launch import resume_target


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


@pytest.mark.parametrize("lora,name", [(False, "model.safetensors"), (False, "model.safetensors.index.json"),
                                       (True, "adapter_model.safetensors")])
def test_refuses_to_overwrite_a_final_model_without_checkpoint(tmp_path, lora, name):
    (tmp_path / name).write_bytes(b"x")
    with pytest.raises(ValueError, match="already holds a trained model.*overwrite_output_dir"):
        resume_target(_args(tmp_path), lora)
    assert (tmp_path / name).exists()


def test_overwrite_starts_over_and_removes_old_checkpoints(tmp_path):
    old = [_ckpt(tmp_path, 2), _ckpt(tmp_path, 4)]
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert resume_target(_args(tmp_path, overwrite_output_dir=True)) is None
    assert not any(p.exists() for p in old)
    assert os.listdir(tmp_path) == ["model.safetensors"]  # only checkpoints are removed
