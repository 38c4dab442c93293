"""Run ``llm/run_finetune.py`` on a JSON config, in one process or under torchrun (gloo, ``OMP_NUM_THREADS=1``),
for the launcher-level distributed tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "llm", "run_finetune.py")


def run_finetune(job, name: str, nproc: int, cfg: dict, port_base: int) -> subprocess.CompletedProcess:
    """Write ``cfg`` to ``job/<name>.json`` and run the launcher on it (torchrun with ``nproc`` ranks when > 1, on
    port ``port_base + pid % 1000``); asserts exit status 0 (the message holds the command and stderr's tail)."""
    path = job / f"{name}.json"
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, LAUNCHER, str(path)] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_port", str(port_base + os.getpid() % 1000), LAUNCHER, str(path)]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stderr[-6000:]}"
    return proc
