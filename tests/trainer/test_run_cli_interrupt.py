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


def test_user_error_names_the_config_file(capsys, monkeypatch, tmp_path):
    """A data / path error found after parsing names the JSON config it came from (was the message alone: with
    several configs at hand, which one had the bad dataset_name_or_path?)."""
    monkeypatch.delenv("PADDLENLP_EXT_TRACEBACK", raising=False)
    config = tmp_path / "sft.json"
    config.write_text("{}")

    def main(argv):
        raise ValueError("dataset_name_or_path '/nope' is neither a directory nor a file")

    monkeypatch.setattr("sys.argv", ["run_finetune.py", str(config)])
    with pytest.raises(SystemExit) as e:
        run_cli(main)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: dataset_name_or_path '/nope'")
    assert f"(config: {config}; PADDLENLP_EXT_TRACEBACK=1" in err

    def names_it(argv):
        raise ValueError(f"{config}: line 1: unknown key")

    with pytest.raises(SystemExit):
        run_cli(names_it)
    assert "(config:" not in capsys.readouterr().err  # said once, not twice
    monkeypatch.setattr("sys.argv", ["run_finetune.py", "--output_dir", "x"])  # no JSON: nothing to name
    with pytest.raises(SystemExit):
        run_cli(main)
    assert "(config:" not in capsys.readouterr().err
