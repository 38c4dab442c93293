"""What llm/run_finetune.py, run_dpo.py and run_reward.py share: every shipped config (run_pretrain.py's too) parses
with its launcher's parser, a run without a model is one error, and packs longer than the model's
max_position_embeddings are warned once at start-up naming both values and the model's config.json.

Tiny random models (``make_tiny_sft_job``: SmolLM2's tokenizer; ``tests/trl/_tiny.py``: a word-level one)."""

import json
import logging
import os

import pytest

from paddlenlp_ext.trl.arguments import parse_dpo_args, parse_rm_args
from tests._scripts import ROOT, load_script
from tests.trl._tiny import make_tiny_model_dir, write_pairs

_SFT = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "per_device_eval_batch_size": 2,
        "learning_rate": 1e-2, "warmup_steps": 0, "logging_steps": 1, "save_steps": 2, "save_strategy": "steps",
        "max_length": 96, "src_length": 48, "flash_mask": True, "do_train": True, "do_eval": True,
        "disable_tqdm": True, "chat_after_train": False, "report_to": "none"}


@pytest.fixture(scope="module")
def sft_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("launchers_sft"), n_train=12, n_dev=3)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("launchers_pairs")
    return (make_tiny_model_dir(str(d / "model")), write_pairs(str(d / "train.jsonl"), 8),
            write_pairs(str(d / "dev.jsonl"), 4, seed=1))


def _sft_argv(root, out, **over):
    """``[config path]`` of an SFT run on ``root``'s model and data (``_SFT`` settings, then ``over``)."""
    cfg = {"model_name_or_path": str(root / "model"), "dataset_name_or_path": str(root / "data"),
           "output_dir": str(out), **_SFT, **over}
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(cfg))
    return [str(path)]


def _pair_argv(pairs, out, **over):
    """Command-line argv of a DPO / RM run on ``pairs`` (later keys win)."""
    model_dir, train, dev = pairs
    kw = {"model_name_or_path": model_dir, "train_dataset_path": train, "dev_dataset_path": dev,
          "output_dir": str(out), "max_seq_len": 64, "max_prompt_len": 24, "per_device_train_batch_size": 1,
          "per_device_eval_batch_size": 2, "learning_rate": 1e-2, "warmup_steps": 0, "save_steps": 2,
          "save_strategy": "steps", "do_train": True, "do_eval": True, "report_to": "none", "disable_tqdm": True,
          **over}
    return [a for k, v in kw.items() for a in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]


def _configs():
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config").rglob("*.json"))


@pytest.mark.parametrize("path", _configs())
def test_every_shipped_config_parses_with_its_launcher(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    kind = os.path.basename(path)[:-len(".json")]
    if kind in ("sft", "lora"):
        model_args, data_args, training_args, _ = load_script("llm/run_finetune.py").parse_args([path])
        # config/ernie35se/finetune_generation/ holds the ERNIE-3.5-SE article's commands as written (unpacked)
        assert bool(model_args.lora) == (kind == "lora") and (data_args.zero_padding or "finetune_generation" in path)
    elif kind == "dpo":
        parse_dpo_args([path])
    elif kind == "rm":
        parse_rm_args([path])
    elif kind.startswith("pretrain"):  # pretrain.json, pretrain_3b.json: llm/run_pretrain.py
        load_script("llm/run_pretrain.py").parse_args([path])
    else:
        pytest.fail(f"{path}: no launcher known for a config named {kind}.json (sft, lora, dpo, rm, pretrain*)")


def test_sft_without_a_model_is_one_error(sft_job, tmp_path):
    # checked before the tokenizer loads (not its TypeError about None)
    argv = _sft_argv(sft_job, tmp_path / "out", max_steps=1, do_eval=False)
    cfg = json.loads(open(argv[0]).read())
    del cfg["model_name_or_path"]  # the key left out (its default is None)
    open(argv[0], "w").write(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_name_or_path is required"):
        load_script("llm/run_finetune.py").main(argv)


@pytest.mark.parametrize("script", ["run_dpo", "run_reward"])
def test_dpo_and_rm_without_a_model_are_one_error(tmp_path, script):
    train = write_pairs(str(tmp_path / "train.jsonl"), 4)
    argv = ["--train_dataset_path", train, "--dev_dataset_path", train, "--output_dir", str(tmp_path / "out"),
            "--max_seq_len", "64", "--max_prompt_len", "24", "--max_steps", "1", "--report_to", "none"]
    with pytest.raises(ValueError, match="model_name_or_path is required"):
        load_script(f"llm/{script}.py").main(argv)


@pytest.mark.parametrize("script", ["run_finetune", "run_dpo", "run_reward"])
def test_max_length_past_max_position_embeddings_warns_once(sft_job, pairs, tmp_path, caplog, script):
    # max_length 300 on a model with max_position_embeddings 256 trains RoPE positions 256..299, past the range the
    # model was trained on: warned once, naming both values and the model's config.json
    def argv(length):
        if script == "run_finetune":
            return _sft_argv(sft_job, tmp_path / f"o{length}", max_steps=1, do_eval=False, save_strategy="no",
                             max_length=length)
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
