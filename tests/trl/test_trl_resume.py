"""run_dpo.py / run_reward.py continue from the output_dir's latest checkpoint when run again (as run_finetune.py
does), and refuse to silently replace a final model that has no checkpoint beside it."""

import logging
import os
import sys

import pytest

from tests.trl._tiny import make_tiny_model_dir, write_pairs

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "llm"))
import run_dpo  # noqa: E402
import run_reward  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_resume")
    return (make_tiny_model_dir(str(d / "model")), write_pairs(str(d / "train.jsonl"), 16),
            write_pairs(str(d / "dev.jsonl"), 4, seed=1))


def _argv(tiny, out, steps, save):
    model, train, dev = tiny
    return ["--model_name_or_path", model, "--train_dataset_path", train, "--dev_dataset_path", dev,
            "--output_dir", str(out),
            "--max_seq_len", "64", "--max_prompt_len", "24", "--per_device_train_batch_size", "1",
            "--max_steps", str(steps), "--logging_steps", "1", "--do_train", "true", "--do_eval", "false",
            "--save_strategy", save, "--save_steps", "2", "--seed", "0", "--report_to", "none"]


@pytest.mark.parametrize("launcher", [run_reward, run_dpo], ids=["rm", "dpo"])
def test_rerun_resumes_latest_checkpoint(tiny, tmp_path, launcher, caplog):
    out = tmp_path / "out"
    launcher.main(_argv(tiny, out, 2, "steps"))
    assert (out / "checkpoint-2").is_dir()
    with caplog.at_level(logging.INFO):
        summary = launcher.main(_argv(tiny, out, 4, "steps"))
    assert f"resuming training at {out / 'checkpoint-2'}" in caplog.text
    assert summary["global_step"] == 4


@pytest.mark.parametrize("launcher", [run_reward, run_dpo], ids=["rm", "dpo"])
def test_rerun_refuses_to_replace_a_final_model_without_checkpoint(tiny, tmp_path, launcher):
    out = tmp_path / "out"
    launcher.main(_argv(tiny, out, 1, "no"))
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="already holds a trained model"):
        launcher.main(_argv(tiny, out, 1, "no"))
    assert (out / "model.safetensors").read_bytes() == before
    launcher.main(_argv(tiny, out, 1, "no") + ["--overwrite_output_dir", "true"])  # asked for: allowed
