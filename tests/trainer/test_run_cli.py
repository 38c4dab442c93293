"""run_cli, the launchers' entry point: Ctrl-C and SIGTERM are one line saying how to resume (exit status 130 and
143, not a traceback from wherever the optimizer happened to be); a user error or a failed save is one ``error:``
line naming the config file; the overwrite_output_dir run's previous_run/ is named and kept."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paddlenlp_ext.trainer import checkpoint as ckpt

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
    """A data / path error found after parsing names the JSON config it came from (with several configs at hand,
    which one had the bad dataset_name_or_path?)."""
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


def test_sigterm_unwinds_like_ctrl_c(capsys, monkeypatch):
    """SIGTERM (timeout, Slurm, Kubernetes) unwinds like Ctrl-C (the output_dir lock and other cleanup run) and
    exits 143; the default handler is back afterwards."""
    import signal
    import time

    monkeypatch.delenv("PADDLENLP_EXT_TRACEBACK", raising=False)
    monkeypatch.setattr("sys.argv", ["run_finetune.py"])
    cleaned = []

    def main(argv):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here at the latest
            raise AssertionError("SIGTERM did not interrupt main")
        finally:
            cleaned.append(True)

    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(SystemExit) as e:
        run_cli(main, resumable=True)
    assert e.value.code == 143 and cleaned == [True]
    assert capsys.readouterr().err.startswith("terminated (SIGTERM): rerun the same command")
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def _args(out, overwrite):
    from types import SimpleNamespace

    return SimpleNamespace(output_dir=str(out), overwrite_output_dir=overwrite, resume_from_checkpoint=None,
                           do_train=True)


def test_interrupt_after_overwrite_names_previous_run(capsys, monkeypatch, tmp_path):
    """An overwrite_output_dir run stopped before saving: the message says where the replaced run is kept, not
    'rerun the same command to resume' (which would start over)."""
    from paddlenlp_ext.trainer.launch import resume_target

    monkeypatch.delenv("PADDLENLP_EXT_TRACEBACK", raising=False)
    monkeypatch.setattr("sys.argv", ["run_finetune.py"])

    def main(argv):
        resume_target(_args(tmp_path, overwrite=True))
        (tmp_path / "previous_run").mkdir(exist_ok=True)  # as clear_previous_run leaves it before the first save
        raise KeyboardInterrupt

    with pytest.raises(SystemExit):
        run_cli(main, resumable=True)
    err = capsys.readouterr().err
    assert err.startswith(f"interrupted: nothing was saved; the run that overwrite_output_dir replaced is kept in "
                          f"{tmp_path / 'previous_run'}") and "the same command starts over" in err
    (tmp_path / "previous_run").rmdir()

    def main_saved(argv):  # the overwrite run has saved (previous_run/ deleted): resuming needs overwrite off
        resume_target(_args(tmp_path, overwrite=True))
        raise KeyboardInterrupt

    with pytest.raises(SystemExit):
        run_cli(main_saved, resumable=True)
    assert capsys.readouterr().err.startswith("interrupted: rerun with overwrite_output_dir false to resume")


def test_interrupt_before_any_checkpoint_says_the_command_starts_over(tmp_path, capsys, monkeypatch):
    """Ctrl-C in a run whose output_dir holds no checkpoint-<step> yet (e.g. the LoRA examples, save_strategy
    "no"): the hint says a rerun starts over; once a checkpoint exists, it says the rerun resumes."""
    from paddlenlp_ext.trainer.launch import resume_target

    monkeypatch.delenv("PADDLENLP_EXT_TRACEBACK", raising=False)
    monkeypatch.setattr("sys.argv", ["run_finetune.py"])

    def main(argv):
        resume_target(_args(tmp_path, overwrite=False))
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        run_cli(main, resumable=True)
    assert e.value.code == 130
    assert capsys.readouterr().err.startswith(f"interrupted: no checkpoint-<step> was saved in {tmp_path} yet")
    other = tmp_path / "other" / "checkpoint-2"
    other.mkdir(parents=True)

    def main_resumed(argv):  # resume_from_checkpoint names a checkpoint elsewhere: the same command resumes it
        args = _args(tmp_path, overwrite=False)
        args.resume_from_checkpoint = str(other)
        resume_target(args)
        raise KeyboardInterrupt

    with pytest.raises(SystemExit):
        run_cli(main_resumed, resumable=True)
    assert capsys.readouterr().err.splitlines()[-1].startswith("interrupted: rerun the same command to resume")
    (tmp_path / "checkpoint-4").mkdir()
    with pytest.raises(SystemExit):
        run_cli(main, resumable=True)
    # the last line: resume_target logs "Checkpoint detected" first where logging is set up
    assert capsys.readouterr().err.splitlines()[-1].startswith("interrupted: rerun the same command to resume")


def test_plain_run_refuses_previous_run(tmp_path):
    """A plain rerun after an overwrite run stopped before saving is refused: it would start from scratch and delete
    previous_run/ (the replaced model) at its first save without being asked to overwrite."""
    from paddlenlp_ext.trainer.launch import resume_target

    (tmp_path / "previous_run").mkdir()
    with pytest.raises(ValueError, match=r"holds previous_run/, the run that an interrupted overwrite_output_dir run "
                                         r"moved aside.*overwrite_output_dir true.*mv "):
        resume_target(_args(tmp_path, overwrite=False))
    assert resume_target(_args(tmp_path, overwrite=True)) is None  # start over; previous_run/ is kept until a save
    (tmp_path / "checkpoint-2").mkdir()  # the overwrite run saved: a plain rerun resumes it
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    assert str(resume_target(_args(tmp_path, overwrite=False))).endswith("checkpoint-2")


def test_sigterm_during_a_checkpoint_write_stays_sigterm():
    """A SIGTERM that hits a checkpoint write stays a SIGTERM (exit 143), not a plain Ctrl-C ('interrupted', exit
    130) re-raised by the write's wrapper."""
    from torch.distributed.checkpoint.api import CheckpointException

    from paddlenlp_ext.trainer.launch import _Terminated

    wrapped = CheckpointException("write", {0: (_Terminated(), [])})
    with pytest.raises(KeyboardInterrupt) as e:  # caught as its base: a plain one must fail here, not stop pytest
        ckpt.reraise_interrupt(wrapped)
    assert type(e.value) is _Terminated
    try:
        raise RuntimeError("unexpected pos") from _Terminated()
    except RuntimeError as err:
        with pytest.raises(KeyboardInterrupt) as e:
            ckpt.reraise_interrupt(err)
    assert type(e.value) is _Terminated


def test_save_error_is_one_line(capsys, monkeypatch):
    def main(argv):
        raise ckpt.SaveError(errno.ENOSPC, "could not write checkpoint checkpoint-4 to /x (...)")

    monkeypatch.setattr(sys, "argv", ["run_finetune.py"])
    monkeypatch.setenv("PADDLENLP_EXT_TRACEBACK", "0")
    with pytest.raises(SystemExit) as info:
        run_cli(main)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: could not write checkpoint checkpoint-4 to /x") and "Traceback" not in err


def test_launcher_prints_a_command_line_mistake_as_one_error_line():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "llm" / "run_finetune.py"),
                           str(root / "config" / "smollm2" / "sft.json"), "--output_dir"], capture_output=True,
                          text=True, env=dict(os.environ, PADDLENLP_EXT_TRACEBACK="0"), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[0] == ("error: command line: --output_dir needs a value (str) but it is the "
                                           "last argument; write --output_dir <value> (or --output_dir=<value>)")



def test_output_into_a_closed_pipe_ends_quietly_with_status_141(monkeypatch):
    """``run_finetune.py --help | head -1``: when the reader has left, the launcher points stdout at /dev/null (no
    second error at exit) and exits 141, the shell's status for SIGPIPE, without a BrokenPipeError traceback."""
    import sys

    import pytest

    from paddlenlp_ext.trainer import launch

    redirected = []
    monkeypatch.setattr(launch.os, "dup2", lambda fd, fd2: redirected.append(fd2))
    monkeypatch.setattr(sys.stdout, "fileno", lambda: 1, raising=False)  # pytest's capture has no real descriptor

    def main(argv):
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(SystemExit) as e:
        launch._run_main(main, [], resumable=False)
    assert e.value.code == 141 and redirected == [1]
