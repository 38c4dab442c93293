"""Ctrl-C during a launcher run: one line saying how to resume, exit status 130 (was a KeyboardInterrupt traceback
from wherever the optimizer happened to be)."""

import pytest

from paddlenlp_ext.trainer.launch import run_cli


def test_keyboard_interrupt_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("PADDLENLP_EXT_TRACEBACK", raising=False)
    monkeypatch.setattr("sys.argv", ["run_finetune.py"])

    def main(argv):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        run_cli(main, resumable=True)  # the training launchers
    err = capsys.readouterr().err
    assert e.value.code == 130
    assert err.startswith("interrupted: rerun the same command") and "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        run_cli(main)  # predict.py, merge_lora_params.py: nothing to resume
    assert e.value.code == 130 and capsys.readouterr().err == "interrupted\n"


def test_traceback_on_request(monkeypatch):
    monkeypatch.setenv("PADDLENLP_EXT_TRACEBACK", "1")
    monkeypatch.setattr("sys.argv", ["run_finetune.py"])

    def main(argv):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_cli(main)
