"""User pass, session 9: three launcher / trainer bugs noted in earlier passes (resume and length checks).

CPU only, tiny random models (the SmolLM2 tokenizer files at most); each test a few seconds.
"""

import json
import logging

import pytest

from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset, load_run_finetune, write_sft_config

_SFT = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "per_device_eval_batch_size": 2,
        "learning_rate": 1e-2, "warmup_steps": 0, "logging_steps": 1, "save_steps": 2, "save_strategy": "steps",
        "max_length": 96, "src_length": 48, "flash_mask": True, "do_train": True, "do_eval": True,
        "disable_tqdm": True, "chat_after_train": False, "report_to": "none"}


@pytest.fixture(scope="module")
def sft_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("up9_sft"), n_train=12, n_dev=3)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    from tests.trl._tiny import make_tiny_model_dir, write_pairs

    d = tmp_path_factory.mktemp("up9_pairs")
    return (make_tiny_model_dir(str(d / "model")), write_pairs(str(d / "train.jsonl"), 8),
            write_pairs(str(d / "dev.jsonl"), 4, seed=1))


def _pair_argv(pairs, out, **over):
    model_dir, train, dev = pairs
    kw = {"model_name_or_path": model_dir, "train_dataset_path": train, "dev_dataset_path": dev,
          "output_dir": str(out), "max_seq_len": 64, "max_prompt_len": 24, "per_device_train_batch_size": 1,
          "per_device_eval_batch_size": 2, "learning_rate": 1e-2, "warmup_steps": 0, "save_steps": 2,
          "save_strategy": "steps", "do_train": True, "do_eval": True, "report_to": "none", "disable_tqdm": True,
          **over}
    return [a for k, v in kw.items() for a in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]


# ---- 1. the "before" dev loss of a resumed run is the resumed model's ---------------------------------------------

def test_sft_resumed_dev_loss_before_is_the_checkpoints(sft_job, caplog):
    # was: summary["dev_loss_before"] = trainer.evaluate() ran before trainer.train(resume_from_checkpoint=...)
    # loaded the checkpoint, so a resumed run reported the dev loss of the base model it had just loaded, not of
    # the model it went on training
    mod = load_run_finetune()
    out = sft_job / "out"
    first = mod.main(write_sft_config(sft_job, out, _SFT, max_steps=2))
    assert (out / "checkpoint-2").is_dir()
    assert abs(first["dev_loss_after"] - first["dev_loss_before"]) > 1e-3  # else the test has no teeth
    second = mod.main(write_sft_config(sft_job, out, _SFT, max_steps=4))
    assert second["global_step"] == 4
    # dev_loss_after of the first run: the model at step 2, i.e. the checkpoint's weights
    assert second["dev_loss_before"] == pytest.approx(first["dev_loss_after"], rel=1e-5)
    # a rerun with nothing left to train reports no "before"
    assert "dev_loss_before" not in mod.main(write_sft_config(sft_job, out, _SFT, max_steps=4))


# ---- 2. a resume that changes the data order is warned -----------------------------------------------------------


def test_sft_launcher_records_the_data_keys_and_resumes_quietly(sft_job, caplog):
    mod = load_run_finetune()
    out = sft_job / "order"
    mod.main(write_sft_config(sft_job, out, _SFT, max_steps=2, do_eval=False))
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["data_order"]["seed"] == 42 and state["data_order"]["max_length"] == 96
    assert state["data_order"]["dataset_name_or_path"] == str(sft_job / "data")
    with caplog.at_level(logging.WARNING):
        mod.main(write_sft_config(sft_job, out, _SFT, max_steps=3, do_eval=False))
    assert "data order" not in caplog.text
    with caplog.at_level(logging.WARNING):
        mod.main(write_sft_config(sft_job, out, _SFT, max_steps=4, do_eval=False, src_length=40))
    assert "src_length=40 (the checkpoint's run: 48)" in caplog.text


# ---- 3. packs longer than the model's trained positions are warned -----------------------------------------------

@pytest.mark.parametrize("script", ["run_finetune", "run_dpo", "run_reward"])
def test_max_length_past_max_position_embeddings_warns_once(sft_job, pairs, tmp_path, caplog, script):
    # was silent: max_length 300 on a model with max_position_embeddings 256 trained RoPE positions 256..299, past
    # the range the model was trained on
    from tests._scripts import load_script

    def argv(length):
        if script == "run_finetune":
            return write_sft_config(sft_job, tmp_path / f"o{length}", _SFT, max_steps=1, do_eval=False,
                                    save_strategy="no", max_length=length)
        return _pair_argv(pairs, tmp_path / f"o{length}", max_steps=1, do_eval=False, save_strategy="no",
                          max_seq_len=length)

    key = "max_length" if script == "run_finetune" else "max_seq_len"
    model_dir = sft_job / "model" if script == "run_finetune" else pairs[0]
    mod = load_script(f"llm/{script}.py")
    with caplog.at_level(logging.WARNING):
        mod.main(argv(300))
    assert caplog.text.count("max_position_embeddings=256") == 1
    assert f"{key}=300" in caplog.text and f"{model_dir}/config.json" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        mod.main(argv(96))
    assert "max_position_embeddings" not in caplog.text


