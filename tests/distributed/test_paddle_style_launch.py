"""``python -m paddlenlp_ext.distributed.launch`` (Paddle's launch flags on torch elastic), gloo on CPU: the same
losses as torchrun, workerlog.<rank> files, a failing rank's status and log tail, one error line for a config
mistake, --max_restarts resuming after a SIGKILLed worker, two nodes on loopback; bad flags one line each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed.launcher_run import ROOT, LAUNCHER, run_finetune

HERE = os.path.dirname(os.path.abspath(__file__))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(flags, script, *args, env=None, timeout=300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "paddlenlp_ext.distributed.launch", *flags, script, *args]
    return subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("plaunch"), n_train=24, n_dev=1)


def _cfg(job, out, **over) -> str:
    cfg = {"model_name_or_path": str(job / "model"), "dataset_name_or_path": str(job / "data"),
           "output_dir": str(job / out), "per_device_train_batch_size": 1, "gradient_accumulation_steps": 2,
           "max_steps": 4, "learning_rate": 3e-3, "warmup_steps": 1, "logging_steps": 1, "save_strategy": "steps",
           "save_steps": 2, "max_length": 96, "src_length": 48, "flash_mask": True, "do_train": True,
           "do_eval": False, "disable_tqdm": True, "chat_after_train": False, "dataloader_shuffle": False,
           "sharding": "stage2"}
    cfg.update(over)
    path = job / f"{out}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _losses(job, out, step=4):
    state = json.loads((job / out / f"checkpoint-{step}" / "trainer_state.json").read_text())
    return [h["loss"] for h in state["log_history"] if "loss" in h]


@pytest.mark.distributed
def test_two_gloo_processes_equal_torchrun_and_write_workerlogs(job):
    proc = _launch(["--nproc_per_node", "2", "--log_dir", str(job / "log")], LAUNCHER, _cfg(job, "ours"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_finetune(job, "torchrun", 2, json.loads((job / "ours.json").read_text()) | {"output_dir": str(job / "tr")},
                 port_base=29800)
    assert _losses(job, "ours") == _losses(job, "tr")
    logs = sorted(p.name for p in (job / "log").iterdir() if p.name.startswith("workerlog"))
    assert logs == ["workerlog.0", "workerlog.1"]
    assert "[summary]" in (job / "log" / "workerlog.0").read_text() and "[summary]" in proc.stdout  # rank 0 teed
    assert "[summary]" not in (job / "log" / "workerlog.1").read_text()


@pytest.mark.distributed
def test_failing_rank_status_and_log_tail(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nprint('rank', os.environ['RANK'], 'up', flush=True)\n"
                      "if os.environ['RANK'] == '1':\n    print('boom on rank 1', file=sys.stderr)\n    sys.exit(3)\n")
    proc = _launch(["--nproc_per_node", "2", "--log_dir", str(tmp_path / "log")], str(script))
    assert proc.returncode == 3
    assert "boom on rank 1" in (tmp_path / "log" / "workerlog.1").read_text()  # stderr joins stdout
    assert "boom on rank 1" in proc.stderr  # the tail of the failing rank's log
    assert f"launch: rank 1 exited with status 3; its log: {tmp_path / 'log' / 'workerlog.1'}" in proc.stderr
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr


@pytest.mark.distributed
def test_config_error_is_one_line(job):
    proc = _launch(["--nproc_per_node", "2", "--log_dir", str(job / "log_bad")], LAUNCHER,
                   _cfg(job, "bad", learning_rat=1.0))
    assert proc.returncode == 2
    text = proc.stdout + proc.stderr
    assert len([ln for ln in text.splitlines() if ln.startswith("error:")]) == 1, text
    assert "learning_rat" in text and "Traceback" not in text and "ChildFailedError" not in text


@pytest.mark.distributed
def test_max_restarts_resumes_after_a_sigkilled_worker(job):
    """Rank 1 is SIGKILLed right after checkpoint-4 of 6 is written; the agent restarts the group, which resumes
    from checkpoint-4 and ends with the weights of an uninterrupted run."""
    over = dict(max_steps=6, overwrite_output_dir=True)
    straight = _launch(["--nproc_per_node", "2", "--log_dir", str(job / "log_s")], LAUNCHER,
                       _cfg(job, "straight", **over))
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _launch(["--nproc_per_node", "2", "--max_restarts", "1", "--log_dir", str(job / "log_k")],
                     os.path.join(HERE, "kill_after_checkpoint.py"), _cfg(job, "killed", **over),
                     env={"KILL_AFTER_STEP": "4"})
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert (job / "log_k" / "workerlog.1.0").is_file()  # the first attempt's log, kept
    assert "resuming at" in (job / "log_k" / "workerlog.0").read_text()
    a, b = load_file(str(job / "straight" / "model.safetensors")), load_file(str(job / "killed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.distributed
def test_two_nodes_on_loopback(job):
    master = f"127.0.0.1:{_port()}"
    cfg = _cfg(job, "nodes")
    cmd = [sys.executable, "-m", "paddlenlp_ext.distributed.launch", "--nnodes", "2", "--master", master,
           "--nproc_per_node", "1", "--log_dir", str(job / "log_n")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    nodes = [subprocess.Popen([*cmd, "--rank", str(r), LAUNCHER, cfg], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [n.communicate(timeout=300) for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], [o[1][-2000:] for o in outs]
    assert _losses(job, "nodes") == _losses(job, "ours")  # 2 ranks either way
    assert {"workerlog.0", "workerlog.1"} <= set(os.listdir(job / "log_n"))


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "7"], "error: --gpus 7: device 7 does not exist"),
    (["--nnodes", "2"], "error: --nnodes 2 needs --master HOST:PORT"),
    (["--nnodes", "2", "--master", "127.0.0.1:1", "--rank", "2"], "error: --rank 2 is not in [0, --nnodes 2)"),
])
def test_bad_flags_are_one_line(flags, message, tmp_path, capsys):
    from paddlenlp_ext.distributed.launch import main

    assert main([*flags, "--log_dir", str(tmp_path), LAUNCHER, "x.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1, err
