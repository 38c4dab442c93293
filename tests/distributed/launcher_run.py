"""Run ``llm/run_finetune.py`` on a JSON config, in one process or under torchrun (gloo, ``OMP_NUM_THREADS=1``),
for the launcher-level distributed tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "llm", "run_finetune.py")


def _descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (children, grandchildren, ...), from ``/proc``; empty where there is none."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():  # self, thread-self, sys, ...
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
        except (ValueError, IndexError, OSError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_group(popen: subprocess.Popen) -> None:
    """SIGKILL the launch's process group (``start_new_session``) and every process below it: torchrun starts
    each rank in a session of its own, so the group alone would leave the ranks running. The ranks are listed
    before anything is killed (once torchrun is gone they are no longer its children)."""
    below = _descendants(popen.pid)
    for kill, target in [(os.killpg, popen.pid)] + [(os.kill, pid) for pid in below]:
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_finetune(job, name: str, nproc: int, cfg: dict, port_base: int,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """Write ``cfg`` to ``job/<name>.json`` and run the launcher on it (torchrun with ``nproc`` ranks when > 1, on
    port ``port_base + pid % 1000``) in its own process group, killed as a whole after ``timeout`` seconds; asserts exit
    status 0 (the message holds the command and stderr's tail)."""
    path = job / f"{name}.json"
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, LAUNCHER, str(path)] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_port", str(port_base + os.getpid() % 1000), LAUNCHER, str(path)]
    # its own process group: on a timeout the whole group (torchrun and every rank) is killed, so a hung
    # collective leaves no orphan ranks behind
    with subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as popen:
        try:
            out, err = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(popen)
            out, err = popen.communicate()
            raise AssertionError(f"{' '.join(cmd)}: no exit within {timeout} s (process group killed):\n"
                                 f"{err[-6000:]}") from None
        except BaseException:  # Ctrl-C, a pytest timeout: no rank outlives the test
            _kill_group(popen)
            popen.communicate()
            raise
    proc = subprocess.CompletedProcess(cmd, popen.returncode, out, err)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stderr[-6000:]}"
    return proc
