"""llm/run_finetune.py end to end on a tiny random Llama (SmolLM2 tokenizer), in-process: training, dev loss,
checkpoint, auto-resume (the dev loss "before" of a resumed run is the checkpoint's; the data keys that decide the
packs are recorded and a change is warned), and a Hugging Face directory that ``transformers`` loads to the same
logits."""

import json
import logging
import os
import sys

import pytest
import torch

from trainer_fixtures import load_run_finetune, write_sft_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launcher():
    return load_run_finetune()


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("rf"), n_train=18, n_dev=3)


_SETTINGS = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 2, "per_device_eval_batch_size": 2,
             "max_steps": 4, "learning_rate": 3e-3, "warmup_steps": 1, "logging_steps": 1, "save_steps": 2,
             "save_strategy": "steps", "max_length": 96, "src_length": 48, "flash_mask": True,
             "greedy_zero_padding": True, "do_train": True, "do_eval": True, "disable_tqdm": True,
             "chat_max_new_tokens": 4}


def _argv(root, out, **over):
    return write_sft_config(root, out, _SETTINGS, **over)


def test_launcher_trains_saves_and_resumes(tiny_job, capsys):
    mod = _launcher()
    out = tiny_job / "out"
    summary = mod.main(_argv(tiny_job, out, max_steps=2))
    assert summary["global_step"] == 2 and summary["dev_loss_after"] < summary["dev_loss_before"]
    assert (out / "checkpoint-2").is_dir() and (out / "model.safetensors").is_file()
    printed = capsys.readouterr().out
    assert "[summary]" in printed and "[chat] assistant:" in printed
    # same output_dir, more steps: resumes from checkpoint-2 (PaddleNLP's auto-resume), not from scratch
    summary = mod.main(_argv(tiny_job, out, max_steps=4))
    assert summary["global_step"] == 4
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert [h["step"] for h in state["log_history"]] == [1, 2, 3, 4]
    # once more: already at max_steps, so nothing trains, no "before" eval, no fake 0.0 loss in the summary
    again = mod.main(_argv(tiny_job, out, max_steps=4, chat_after_train=False))
    assert again["global_step"] == 4 and "dev_loss_before" not in again and again["train_loss"] is None
    assert again["dev_loss_after"] == pytest.approx(summary["dev_loss_after"], rel=1e-6)

    # the final directory is a Hugging Face Llama that transformers loads to the same logits
    import transformers

    from paddlenlp_ext.transformers import AutoModelForCausalLM

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = torch.randint(0, 1000, (1, 12))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        got = ours(input_ids=ids)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok.chat_template


def test_finished_run_keeps_a_newer_final_model(tiny_job):
    """A rerun whose latest checkpoint is already at max_steps trains nothing and must not overwrite the final
    model (here from step 3) with that checkpoint's older weights (step 2)."""
    mod = _launcher()
    out = tiny_job / "keep"
    mod.main(_argv(tiny_job, out, max_steps=3, do_eval=False, chat_after_train=False))
    final = (out / "model.safetensors").read_bytes()
    again = mod.main(_argv(tiny_job, out, max_steps=2, do_eval=False, chat_after_train=False))
    assert again["global_step"] == 2 and again["train_loss"] is None
    assert (out / "model.safetensors").read_bytes() == final


def test_lora_on_a_full_finetune_checkpoint_is_a_clear_error(tiny_job):
    """Resuming a full fine-tune's checkpoint with lora=true: a ValueError naming the checkpoint and the fix
    (the launcher prints it as one ``error:`` line, exit 2), not DCP's raw missing-key RuntimeError."""
    mod = _launcher()
    out = tiny_job / "full_then_lora"
    mod.main(_argv(tiny_job, out, max_steps=2, do_eval=False, chat_after_train=False))
    with pytest.raises(ValueError, match="checkpoint-2 does not match this model.*overwrite_output_dir"):
        mod.main(_argv(tiny_job, out, max_steps=4, lora=True, lora_rank=4, do_eval=False, chat_after_train=False))


def test_lora_merge_weights_saves_adapter_and_equal_merged_model(tiny_job):
    """``lora`` + ``merge_weights``: the PEFT adapter lands in output_dir and the merged full model in
    output_dir/merged, whose logits equal base + adapter (the fp32 fold, rounded once)."""
    from paddlenlp_ext.peft import load_lora
    from paddlenlp_ext.transformers import AutoModelForCausalLM

    mod = _launcher()
    out = tiny_job / "lora_merged"
    mod.main(_argv(tiny_job, out, max_steps=2, lora=True, lora_rank=4, merge_weights=True, do_eval=False,
                   chat_after_train=False, save_strategy="no"))
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    # the merged model has its own directory, without adapter files (transformers + peft would apply them again)
    assert (out / "merged" / "model.safetensors").is_file() and not (out / "merged" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(out / "merged")).eval()
    lora = load_lora(AutoModelForCausalLM.from_pretrained(str(tiny_job / "model")), str(out)).eval()
    ids = torch.randint(0, 1000, (1, 12))
    with torch.no_grad():
        got, ref = merged(input_ids=ids), lora(input_ids=ids)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(str(tiny_job / "model")).eval()(input_ids=ids)
    assert (ref - base).abs().max() > 1e-4  # the adapter trained to something: the check is not vacuous


def test_unknown_key_is_an_error(tiny_job):
    mod = _launcher()
    with pytest.raises(ValueError, match="chat_after_trainn"):
        mod.main(_argv(tiny_job, tiny_job / "bad", chat_after_trainn=True))


@pytest.mark.distributed
def test_launcher_torchrun_lora_matches_one_process(tiny_job):
    """torchrun, 2 ranks (FSDP2, gloo) x 1 pack vs 1 process x 2 packs: same losses, same saved PEFT adapter
    (tolerance: fp32 re-association of the summed gradients, measured ~1e-6 on this size)."""
    import subprocess

    from safetensors.torch import load_file

    script = os.path.join(ROOT, "llm", "run_finetune.py")
    common = ["--lora", "true", "--learning_rate", "1e-2", "--device", "cpu", "--chat_after_train", "false",
              "--save_steps", "4", "--dataloader_drop_last", "true"]  # same packs per step even across epochs
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {}
    for tag, launch, extra in (
            ("one", [sys.executable, script], ["--per_device_train_batch_size", "2"]),
            ("two", [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                     str(32000 + os.getpid() % 2000), script], ["--sharding", "stage2"])):
        out = tiny_job / f"lora_{tag}"
        proc = subprocess.run(launch + _argv(tiny_job, out) + common + extra, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-5000:]
        import re

        runs[tag] = (json.loads(re.search(r"\[summary\] (\{.*\})", proc.stdout).group(1)),
                     load_file(str(out / "adapter_model.safetensors")))
        assert (out / "adapter_config.json").is_file()
    (s1, a1), (s2, a2) = runs["one"], runs["two"]
    assert s2["train_loss"] == pytest.approx(s1["train_loss"], rel=1e-5)
    assert s2["dev_loss_after"] == pytest.approx(s1["dev_loss_after"], rel=1e-5)
    assert sorted(a1) == sorted(a2) and all(".lora_" in k for k in a1)
    for k in a1:
        torch.testing.assert_close(a2[k], a1[k], rtol=1e-4, atol=1e-5)


def test_fused_keys_reach_the_model(tiny_job, monkeypatch):
    """``use_fused_*`` keys of the JSON config end up on the model config (set_llm_config in the launcher), and
    a run with the fused cross entropy switched off trains to the same losses as the default fused one."""
    mod = _launcher()
    seen = {}
    real = mod.build_model

    def spy(model_args, training_args):
        model = real(model_args, training_args)
        seen["model"] = model
        return model

    monkeypatch.setattr(mod, "build_model", spy)
    runs = {}
    for fused in (True, False):
        out = tiny_job / f"fused_{fused}"
        runs[fused] = mod.main(_argv(tiny_job, out, max_steps=2, do_eval=False, use_fused_swiglu=True,
                                     use_fused_linear_cross_entropy=fused, chat_after_train=False))
        cfg = seen["model"].config
        assert cfg.use_fused_swiglu is True and cfg.use_fused_linear_cross_entropy is fused
    assert runs[True]["train_loss"] == pytest.approx(runs[False]["train_loss"], rel=1e-5)


def test_cli_help_and_user_errors_without_traceback(tmp_path):
    """``--help`` lists the keys and exits 0; a config mistake prints one ``error:`` message (exit 2, no
    traceback); an output_dir that is a file is refused before anything loads."""
    import subprocess

    script = os.path.join(ROOT, "llm", "run_finetune.py")
    env = dict(os.environ, PADDLENLP_EXT_TRACEBACK="0")
    helped = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert helped.returncode == 0 and "--learning_rate (float, default" in helped.stdout
    # keys without a help text end at their note, not at ': .'
    assert not [ln for ln in helped.stdout.splitlines() if ln.startswith("  --") and ln.rstrip().endswith((": .", ":"))]
    (tmp_path / "afile").write_text("x")
    for cfg, expected in (({"output_dir": str(tmp_path / "o"), "learning_rat": 1e-4}, "did you mean 'learning_rate'"),
                          ({"output_dir": str(tmp_path / "afile")}, "is an existing file, not a directory"),
                          ({"output_dir": str(tmp_path / "afile" / "sub")}, "cannot be created")):
        path = tmp_path / "cfg.json"
        path.write_text(json.dumps(dict(cfg, model_name_or_path="unused", dataset_name_or_path=str(tmp_path))))
        proc = subprocess.run([sys.executable, script, str(path)], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stderr.startswith("error: ")


# one optimizer step per micro-batch, a checkpoint every 2 steps: resumed runs of a few steps
_RESUME = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "per_device_eval_batch_size": 2,
           "learning_rate": 1e-2, "warmup_steps": 0, "logging_steps": 1, "save_steps": 2, "save_strategy": "steps",
           "max_length": 96, "src_length": 48, "flash_mask": True, "do_train": True, "do_eval": True,
           "disable_tqdm": True, "chat_after_train": False, "report_to": "none"}


def test_resumed_dev_loss_before_is_the_checkpoints(tiny_job, caplog):
    # dev_loss_before is evaluated after train(resume_from_checkpoint=...) loads the checkpoint: the model the run
    # goes on training, not the base model it loaded first
    mod = load_run_finetune()
    out = tiny_job / "out_resumed_dev_loss"
    first = mod.main(write_sft_config(tiny_job, out, _RESUME, max_steps=2))
    assert (out / "checkpoint-2").is_dir()
    assert abs(first["dev_loss_after"] - first["dev_loss_before"]) > 1e-3  # else the test has no teeth
    second = mod.main(write_sft_config(tiny_job, out, _RESUME, max_steps=4))
    assert second["global_step"] == 4
    # dev_loss_after of the first run: the model at step 2, i.e. the checkpoint's weights
    assert second["dev_loss_before"] == pytest.approx(first["dev_loss_after"], rel=1e-5)
    # a rerun with nothing left to train reports no "before"
    assert "dev_loss_before" not in mod.main(write_sft_config(tiny_job, out, _RESUME, max_steps=4))


def test_launcher_records_the_data_keys_and_warns_when_one_changes(tiny_job, caplog):
    mod = load_run_finetune()
    out = tiny_job / "order"
    mod.main(write_sft_config(tiny_job, out, _RESUME, max_steps=2, do_eval=False))
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["data_order"]["seed"] == 42 and state["data_order"]["max_length"] == 96
    assert state["data_order"]["dataset_name_or_path"] == str(tiny_job / "data")
    with caplog.at_level(logging.WARNING):
        mod.main(write_sft_config(tiny_job, out, _RESUME, max_steps=3, do_eval=False))
    assert "data order" not in caplog.text
    with caplog.at_level(logging.WARNING):
        mod.main(write_sft_config(tiny_job, out, _RESUME, max_steps=4, do_eval=False, src_length=40))
    assert "src_length=40 (the checkpoint's run: 48)" in caplog.text
