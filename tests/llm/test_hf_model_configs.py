"""config/{qwen2.5,qwen3,mistral,gemma3}/*.json parse with their launcher's keys (no unknown or misspelt key)."""

import glob
import os

import pytest

from tests._scripts import ROOT, load_script

CONFIGS = sorted(p for d in ("qwen2.5", "qwen3", "mistral", "gemma3") for p in glob.glob(str(ROOT / "config" / d / "*.json")))


def test_every_family_has_the_four_jobs():
    for d in ("qwen2.5", "qwen3", "mistral", "gemma3"):
        assert sorted(os.listdir(ROOT / "config" / d)) == ["dpo.json", "lora.json", "rm.json", "sft.json"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_config_parses(path):
    job = os.path.basename(path)
    if job in ("sft.json", "lora.json"):
        model_args, _, training_args, _ = load_script("llm/run_finetune.py").parse_args([path])
        assert model_args.lora == (job == "lora.json")
    else:
        from paddlenlp_ext.trl.arguments import parse_dpo_args, parse_rm_args

        model_args = (parse_dpo_args if job == "dpo.json" else parse_rm_args)([path])[0]
    assert model_args.model_name_or_path.startswith("/models/") and model_args.model_implementation == "auto"
