"""save_adapter warns when the adapter sits on a random-init ERNIE preset (config/ernie35se/dpo.json): the base
weights are never saved, so the adapter alone can never be merged or reloaded (load_merged_lora refuses it)."""

import logging
from types import SimpleNamespace

import pytest

from paddlenlp_ext.trainer.launch import save_adapter


@pytest.mark.parametrize("base,merge,warned", [("ernie/tiny-random-ernie", False, True),
                                               ("ernie/tiny-random-ernie", True, False),  # SFT merges in-run
                                               ("/models/llama", False, False)])
def test_warning_for_an_adapter_on_an_unsaved_base(tmp_path, monkeypatch, caplog, base, merge, warned):
    monkeypatch.setattr("paddlenlp_ext.peft.save_lora", lambda *a, **k: None)
    trainer = SimpleNamespace(model=None, tokenizer=None, dp=SimpleNamespace(is_main=True))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer.launch"):
        save_adapter(trainer, SimpleNamespace(model_name_or_path=base, merge_weights=merge), str(tmp_path))
    hits = [r.getMessage() for r in caplog.records if "random-init" in r.getMessage()]
    assert bool(hits) == warned, hits
