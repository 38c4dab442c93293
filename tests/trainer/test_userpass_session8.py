"""New-user pass, session 8: each test reproduces one bug found by following README.md as a new user and then
trying what users try (resume with a changed config, LoRA / DPO variants, odd data, PaddleNLP keys).

CPU only, no model weights (the SmolLM2 tokenizer files at most).
"""

import json
import logging
import os

import pytest
import torch

from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    from tests.trl._tiny import make_tiny_model_dir, write_pairs

    d = tmp_path_factory.mktemp("userpass8_pairs")
    return make_tiny_model_dir(str(d / "model")), write_pairs(str(d / "train.jsonl"), 8)


def test_merge_lora_params_refuses_an_output_dir_holding_an_adapter(tmp_path):
    # was: --output_path <another LoRA run's output_dir> wrote the merged weights beside that adapter's files, so
    # transformers (with peft) loads the merged model with that adapter applied on top (the reason --output_path =
    # --lora_path is refused); the base-directory case is refused since 0b88f9d
    from paddlenlp_ext.peft import apply_lora, save_lora
    from paddlenlp_ext.transformers import AutoModelForCausalLM
    from tests._scripts import load_script
    from tests.trl._tiny import make_tiny_model_dir

    base = make_tiny_model_dir(str(tmp_path / "base"))
    model = apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2})
    save_lora(model, str(tmp_path / "adapter"), base_model_name_or_path=base)
    save_lora(model, str(tmp_path / "other_adapter"), base_model_name_or_path=base)
    merge = load_script("llm/merge_lora_params.py")
    with pytest.raises(ValueError, match=r"holds a LoRA adapter \(adapter_config\.json\)"):
        merge.main(["--lora_path", str(tmp_path / "adapter"), "--output_path", str(tmp_path / "other_adapter")])
    assert not os.path.exists(tmp_path / "other_adapter" / "model.safetensors")
    assert merge.main(["--lora_path", str(tmp_path / "adapter"), "--output_path", str(tmp_path / "merged")]) == 0


