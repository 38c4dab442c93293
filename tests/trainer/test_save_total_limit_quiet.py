"""``save_total_limit <= 0`` warns that every checkpoint is kept only when checkpoints are saved at all.

Before: ``--save_total_limit 0 --save_strategy no`` warned "keeps ALL checkpoints" for a run that saves none.
"""

from __future__ import annotations

import logging

from paddlenlp_ext.trainer.arguments import TrainingArguments


def _limit_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "save_total_limit" in r.getMessage()]


def test_no_warning_when_nothing_is_saved(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        TrainingArguments(output_dir=str(tmp_path / "o"), save_total_limit=0, save_strategy="no")
    assert not _limit_warnings(caplog)


def test_warning_kept_when_checkpoints_are_saved(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        TrainingArguments(output_dir=str(tmp_path / "o"), save_total_limit=0, save_strategy="steps")
    assert len(_limit_warnings(caplog)) == 1
