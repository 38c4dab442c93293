"""run_dpo.py / run_reward.py continue from the output_dir's latest checkpoint when run again (as run_finetune.py
does), and refuse to silently replace a final model that has no checkpoint beside it. A resumed run trains and
reports as the uninterrupted one: the updated DPO reference model is restored, and the dev metrics "before" are the
checkpoint's."""

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


def _argv(tiny, out, steps, save, **over):
    """The launcher's argv: 2-step checkpoints, no evaluation unless ``over`` says so (later keys win)."""
    model, train, dev = tiny
    kw = {"model_name_or_path": model, "train_dataset_path": train, "dev_dataset_path": dev, "output_dir": str(out),
          "max_seq_len": 64, "max_prompt_len": 24, "per_device_train_batch_size": 1, "max_steps": steps,
          "logging_steps": 1, "do_train": True, "do_eval": False, "save_strategy": save, "save_steps": 2, "seed": 0,
          "report_to": "none", **over}
    return [a for k, v in kw.items() for a in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]


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


def test_dpo_resume_restores_the_updated_reference_model(tiny, tmp_path):
    # ref_model_update_steps=2: the reference is the policy of step 2 during steps 3-4. A run resumed from
    # checkpoint-2 must restore that reference, not rebuild it from the base model (else steps 3-4 train against
    # another reference than the uninterrupted run: silently different weights)
    from safetensors.torch import load_file

    kw = dict(learning_rate=1e-2, lr_scheduler_type="constant", warmup_ratio=0, ref_model_update_steps=2)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_dpo.main(_argv(tiny, straight, 4, "no", **kw))
    run_dpo.main(_argv(tiny, resumed, 2, "steps", **kw))
    run_dpo.main(_argv(tiny, resumed, 4, "steps", **kw))
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-6, worst


@pytest.mark.parametrize("launcher", [run_reward, run_dpo], ids=["rm", "dpo"])
def test_resumed_dev_metrics_before_are_the_checkpoints(tiny, tmp_path, launcher):
    # dev_before of a resumed run is evaluated after the checkpoint is loaded: the model it goes on training
    key = "dev_before"
    kw = dict(do_eval=True, per_device_eval_batch_size=2, learning_rate=1e-2, warmup_steps=0, disable_tqdm=True)
    out = tmp_path / "out"
    first = launcher.main(_argv(tiny, out, 2, "steps", **kw))
    assert abs(first["dev_after"]["eval_loss"] - first[key]["eval_loss"]) > 1e-3
    second = launcher.main(_argv(tiny, out, 3, "steps", **kw))
    assert second["global_step"] == 3
    assert second[key]["eval_loss"] == pytest.approx(first["dev_after"]["eval_loss"], abs=2e-5)  # rounded to 5
