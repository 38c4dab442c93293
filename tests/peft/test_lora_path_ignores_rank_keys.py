"""apply_lora with lora_path loads the adapter with its own r / lora_alpha (PaddleNLP LoRAModel.from_pretrained);
lora_rank / lora_alpha keys that differ are ignored, and now a warning names both values (before, the launcher
logged "lora_alpha=-1: using PaddleNLP's value 8 (2*lora_rank)" and the adapter's 16 was used, silently)."""

import logging

from paddlenlp_ext.peft import apply_lora, save_lora
from paddlenlp_ext.transformers import AutoModelForCausalLM
from tests.trl._tiny import make_tiny_model_dir


def test_differing_rank_and_alpha_are_reported(tmp_path, caplog):
    base = make_tiny_model_dir(str(tmp_path / "base"))
    save_lora(apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 4, "lora_alpha": 8}),
              str(tmp_path / "lora"), base_model_name_or_path=base)
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.peft.lora"):
        model = apply_lora(AutoModelForCausalLM.from_pretrained(base),
                           {"lora_path": str(tmp_path / "lora"), "lora_rank": 2, "lora_alpha": 4})
    assert model.lora_config.r == 4 and model.lora_config.lora_alpha == 8  # the adapter's own
    msgs = [r.getMessage() for r in caplog.records]
    assert any("lora_rank=2" in m and "r=4" in m and "lora_alpha=4" in m and "lora_alpha=8" in m for m in msgs), msgs
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.peft.lora"):
        apply_lora(AutoModelForCausalLM.from_pretrained(base),
                   {"lora_path": str(tmp_path / "lora"), "lora_rank": 4, "lora_alpha": 8})
    assert not caplog.records  # matching keys: nothing to say
