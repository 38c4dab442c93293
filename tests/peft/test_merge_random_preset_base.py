"""A LoRA adapter trained on a random-init ERNIE preset (config/ernie35se/lora.json) cannot be merged or chatted with
later: the preset's weights were never saved, so loading "ernie/tiny-random-ernie" again builds a different random
model and the adapter would be applied to weights it was not trained with, silently. load_merged_lora (used by
llm/merge_lora_params.py and llm/predict.py) refuses it with the way out."""

import json

import pytest

from paddlenlp_ext.peft import load_merged_lora
from tests._scripts import load_script


def _adapter_dir(path, base):
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                          "base_model_name_or_path": base}))
    (path / "adapter_model.safetensors").write_bytes(b"")  # never read: refused before any load
    return str(path)


def test_load_merged_lora_refuses_a_random_preset_base(tmp_path):
    lora = _adapter_dir(tmp_path / "lora", "ernie/tiny-random-ernie")
    with pytest.raises(ValueError, match=r"random-init ERNIE preset.*merge_weights: true"):
        load_merged_lora(lora, "ernie/tiny-random-ernie")


def test_merge_script_names_the_problem(tmp_path):
    mod = load_script("llm/merge_lora_params.py")
    lora = _adapter_dir(tmp_path / "lora", "ernie/tiny-random-ernie")
    with pytest.raises(ValueError, match="ernie/tiny-random-ernie"):
        mod.main(["--lora_path", lora, "--output_path", str(tmp_path / "merged")])
    assert not (tmp_path / "merged").exists()
