"""The progress bar and other output share the terminal: log records during training go through tqdm (a line of
their own, the bar redrawn below), and the bar is closed when training stops by Ctrl-C or an error, so that the
launcher's message starts a new line (not 'train: 50%|...|[23:37:27] [INFO] ... saved checkpoint' or
'train: 0%|...|interrupted: rerun ...' on the bar's line)."""

import logging
import re

import pytest

from paddlenlp_ext.trainer.logging_utils import setup_logging
from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset


def _console_handlers():
    return [type(h).__name__ for h in logging.getLogger("paddlenlp_ext").handlers]


def test_logs_go_through_the_bar_and_it_closes_on_interrupt(make_args, tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(logging.getLogger("paddlenlp_ext"), "handlers", [])  # a console handler on this test's
    setup_logging(0)  # stderr, as a launcher's process has (an earlier test's may write to a stale capture)
    before = _console_handlers()
    args = make_args(disable_tqdm=False, save_strategy="steps", save_steps=1, output_dir=str(tmp_path / "o"))
    t = Trainer(tiny_model(), args, train_dataset=PackDataset(n=7))
    real, seen = t.training_step, []

    def step(micro):
        seen.append(_console_handlers())
        if len(seen) == 3:
            raise KeyboardInterrupt
        return real(micro)

    monkeypatch.setattr(t, "training_step", step)
    with pytest.raises(KeyboardInterrupt):
        t.train()
    assert all(h == ["_TqdmLoggingHandler"] for h in seen[1:])  # checkpoint-1's log record went through tqdm
    assert _console_handlers() == before  # restored
    err = capsys.readouterr().err
    assert err.endswith("\n")  # the bar's line is ended: what the launcher prints next starts a line
    saved = re.findall(r"(?:^|[\r\n])\[\d\d:\d\d:\d\d\] \[INFO\] [\w.]+: saved checkpoint", err)
    assert len(saved) == 2  # each at the start of a (cleared) line
    assert not re.search(r"it/s[^\r\n]*\]\[\d\d:\d\d:\d\d\]", err)  # never right after the bar's text
