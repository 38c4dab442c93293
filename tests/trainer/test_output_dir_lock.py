"""One training run per output_dir: the launchers hold ``<output_dir>/.lock`` (fcntl.flock) for the whole job.

A second run into a busy directory fails at once naming the directory and the holder's pid and host; a lock left by
a killed run is taken over with a warning; the lock is released when ``main`` returns, raises or is interrupted
(in-process tests call ``main`` repeatedly), survives ``overwrite_output_dir``'s clean-up, and does not get in the
way of resuming (the same command run again)."""

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from paddlenlp_ext.trainer.launch import LOCK_NAME, OutputDirLock, output_dir_lock
from trainer_fixtures import load_run_finetune, write_sft_config

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fcntl.flock is POSIX")


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("lock"), n_train=4, n_dev=2)


_SETTINGS = {"per_device_train_batch_size": 1, "max_steps": 1, "max_length": 64, "src_length": 32,
             "flash_mask": True, "do_train": True, "do_eval": False, "disable_tqdm": True,
             "save_strategy": "steps", "save_steps": 1, "chat_after_train": False, "report_to": []}


def _argv(root, out, **over):
    return write_sft_config(root, out, _SETTINGS, **over)


@pytest.fixture
def holder(tmp_path):
    """``start(dir)``: another process that holds ``dir``'s lock until the test ends; returns its pid."""
    procs = []

    def start(out):
        code = textwrap.dedent(f"""
            import sys, time
            from paddlenlp_ext.trainer.launch import OutputDirLock
            with OutputDirLock({str(out)!r}):
                print("locked", flush=True)
                sys.stdin.readline()
        """)
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "locked"
        return p.pid

    yield start
    for p in procs:
        p.stdin.close()
        p.wait(timeout=30)


def _lock_is_free(out) -> bool:
    try:
        with OutputDirLock(str(out)):
            return True
    except ValueError:
        return False


def test_second_run_fails_at_once_naming_dir_pid_and_host(tiny_job, holder, monkeypatch):
    mod = load_run_finetune()
    out = tiny_job / "busy"
    pid = holder(out)
    # nothing may load before the lock refuses: building the model would fail the test
    monkeypatch.setattr(mod, "build_model", lambda *a, **k: pytest.fail("loaded a model into a busy output_dir"))
    with pytest.raises(ValueError) as e:
        mod.main(_argv(tiny_job, out, overwrite_output_dir=True))
    msg = str(e.value)
    assert f"output_dir {out} is in use by another training run (pid {pid} on host {socket.gethostname()}" in msg
    assert "choose another output_dir" in msg
    assert (out / LOCK_NAME).is_file()  # the holder's lock is untouched


def test_lock_released_on_return_error_and_interrupt_and_resume_works(tiny_job, monkeypatch):
    mod = load_run_finetune()
    out = tiny_job / "cycle"
    seen = {}
    real_clear = mod.clear_previous_run

    def clear_and_check(args):  # inside the job: held, and overwrite_output_dir's clean-up keeps it
        real_clear(args)
        seen["held"] = (out / LOCK_NAME).is_file() and not _lock_is_free(out)

    monkeypatch.setattr(mod, "clear_previous_run", clear_and_check)
    assert mod.main(_argv(tiny_job, out))["global_step"] == 1
    assert seen.pop("held") and not (out / LOCK_NAME).exists() and _lock_is_free(out)
    # run again into the same directory: resumes from checkpoint-1 (the lock of the first run is gone)
    assert mod.main(_argv(tiny_job, out, max_steps=2))["global_step"] == 2
    assert seen.pop("held") and (out / "checkpoint-2").is_dir() and not (out / LOCK_NAME).exists()
    # overwrite_output_dir removes the old run after load; the lock file survives that
    assert mod.main(_argv(tiny_job, out, overwrite_output_dir=True))["global_step"] == 1
    assert seen.pop("held") and not (out / "checkpoint-2").exists() and not (out / LOCK_NAME).exists()
    # an error inside the job releases the lock
    with pytest.raises(ValueError, match="chat_template"):
        mod.main(_argv(tiny_job, out, chat_template=str(tiny_job / "typo.jinja")))
    assert not (out / LOCK_NAME).exists() and _lock_is_free(out)
    # so does Ctrl-C
    monkeypatch.setattr(mod, "build_model", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        mod.main(_argv(tiny_job, out))
    assert not (out / LOCK_NAME).exists() and _lock_is_free(out)


def test_failed_run_into_a_new_dir_leaves_no_empty_dir(tiny_job):
    mod = load_run_finetune()
    out = tiny_job / "never"
    with pytest.raises(ValueError, match="chat_template"):
        mod.main(_argv(tiny_job, out, chat_template=str(tiny_job / "typo.jinja")))
    assert not out.exists()


def test_failed_run_leaves_no_empty_parent_dirs_either(tiny_job):
    # makedirs' parents of output_dir (an empty ./checkpoints/) go too when a run fails at once
    mod = load_run_finetune()
    out = tiny_job / "new_parent" / "deeper" / "never"
    argv = _argv(tiny_job, tiny_job / "cfg_np", chat_template=str(tiny_job / "typo.jinja"))  # config beside it
    with pytest.raises(ValueError, match="chat_template"):
        mod.main(argv + ["--output_dir", str(out)])
    assert not (tiny_job / "new_parent").exists()


def test_lock_release_keeps_parents_that_existed_or_hold_files(tmp_path):
    (tmp_path / "kept").mkdir()
    with OutputDirLock(str(tmp_path / "kept" / "a" / "b")):
        (tmp_path / "kept" / "a" / "note.txt").write_text("x")  # written by someone else meanwhile
    assert not (tmp_path / "kept" / "a" / "b").exists()
    assert (tmp_path / "kept" / "a" / "note.txt").exists() and (tmp_path / "kept").is_dir()


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, caplog):
    out = tmp_path / "stale"
    out.mkdir()
    # a run killed with SIGKILL leaves its .lock behind; the OS has dropped its flock
    dead = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE, text=True)
    dead_pid = int(dead.communicate()[0])
    (out / LOCK_NAME).write_text(json.dumps({"pid": dead_pid, "host": socket.gethostname()}))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer.launch"):
        with OutputDirLock(str(out)):
            info = json.loads((out / LOCK_NAME).read_text())
            assert info == {"pid": os.getpid(), "host": socket.gethostname()}
    msgs = [r.getMessage() for r in caplog.records]
    assert any(f"taking over the stale lock of pid {dead_pid} on host {socket.gethostname()}" in m for m in msgs)
    assert not (out / LOCK_NAME).exists()


def test_lock_of_a_killed_process_is_stale(tmp_path, caplog):
    """SIGKILL: no clean-up ran, the file stays, the OS released the flock; the next run takes over."""
    out = tmp_path / "killed"
    code = (f"from paddlenlp_ext.trainer.launch import OutputDirLock; import time; "
            f"OutputDirLock({str(out)!r}).acquire(); print('locked', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    assert not _lock_is_free(out)
    p.kill()
    p.wait(timeout=30)
    assert (out / LOCK_NAME).is_file()
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer.launch"):
        assert _lock_is_free(out)
    assert any(f"stale lock of pid {p.pid}" in r.getMessage() for r in caplog.records)


class _Args:
    def __init__(self, out, do_train=True):
        self.output_dir, self.do_train = str(out), do_train


def test_only_training_rank_zero_locks(tmp_path, monkeypatch):
    out = tmp_path / "o"
    with output_dir_lock(_Args(out)):
        assert (out / LOCK_NAME).is_file()
        with pytest.raises(ValueError, match="is in use by another training run"):
            with output_dir_lock(_Args(out)):
                pass
        with output_dir_lock(_Args(out, do_train=False)):  # evaluation only: writes no checkpoint, takes no lock
            pass
        monkeypatch.setenv("RANK", "1")  # under torchrun only rank 0 locks
        with output_dir_lock(_Args(out)):
            pass
    assert not out.exists()  # created by the lock, left empty: removed with it


@pytest.mark.parametrize("launcher", ["run_dpo", "run_reward"])
def test_dpo_and_reward_launchers_take_the_lock(tmp_path, holder, launcher):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "llm"))
    try:
        mod = __import__(launcher)
    finally:
        sys.path.pop(0)
    out = tmp_path / "out"
    pid = holder(out)
    with pytest.raises(ValueError, match=rf"output_dir {out} is in use by another training run \(pid {pid} on"):
        mod.main(["--model_name_or_path", str(tmp_path / "no-model"), "--output_dir", str(out),
                  "--do_train", "true", "--train_dataset_path", str(tmp_path / "none.jsonl")])



def test_uncreatable_output_dir_is_a_value_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"cannot create the lock file .*choose a writable output_dir"):
        OutputDirLock(str(blocker / "out")).acquire()
