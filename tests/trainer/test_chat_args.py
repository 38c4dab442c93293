"""run_finetune's ChatArgument: chat_max_new_tokens < 1 with chat_after_train is a config error (was accepted and
printed an empty reply; predict.py already refuses --max_new_tokens < 1)."""

import json

import pytest

from trainer_fixtures import load_run_finetune


def _launcher():
    return load_run_finetune()


def _cfg(tmp_path, **over):
    cfg = {"model_name_or_path": "m", "dataset_name_or_path": "d", "output_dir": str(tmp_path / "out")}
    cfg.update(over)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    return [str(tmp_path / "c.json")]


def test_chat_max_new_tokens_below_one(tmp_path):
    with pytest.raises(ValueError, match="chat_max_new_tokens must be >= 1"):
        _launcher().parse_args(_cfg(tmp_path, chat_max_new_tokens=0))


def test_no_check_without_the_chat(tmp_path):
    *_, chat = _launcher().parse_args(_cfg(tmp_path, chat_max_new_tokens=0, chat_after_train=False))
    assert not chat.chat_after_train
