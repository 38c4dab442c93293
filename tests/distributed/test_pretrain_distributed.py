"""``llm/run_pretrain.py`` under torchrun (2 processes, gloo): ``sharding stage2`` over two data ranks matches one
process with the same global batch, and a one-process checkpoint resumed over two data ranks continues at the exact
next samples (the checkpoint's sample count keeps the index, the consumed prefix is converted).

Bound 1e-4 relative, as test_launcher_distributed.py (fp32 reduction order); reading other samples, or a gradient
scaled by the data-parallel size, moves the losses by >= 1e-2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "llm"))
from _pretrain_job import make_pretrain_job, pretrain_config, losses  # noqa: E402

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "llm", "run_pretrain.py")
RTOL = 1e-4


def _launch(job, name: str, nproc: int, cfg: dict):
    path = job / f"{name}.json"
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, LAUNCHER, str(path)] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_port", str(29850 + os.getpid() % 100), LAUNCHER, str(path)]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stderr[-6000:]}"


def _close(got, want):
    assert len(got) == len(want) and all(abs(a - b) <= RTOL * abs(b) for a, b in zip(got, want)), (got, want)


def test_sharding_stage2_and_resume_over_two_ranks(tmp_path):
    job = make_pretrain_job(tmp_path)
    base = dict(do_eval=False, max_steps=4, save_steps=2)
    _launch(job, "one", 1, pretrain_config(job, "out_one", **base))
    ref = losses(job / "out_one", 4)
    _launch(job, "stage2", 2, pretrain_config(job, "out_s2", sharding="stage2", per_device_train_batch_size=1, **base))
    _close(losses(job / "out_s2", 4), ref)
    (job / "out_resume").mkdir()
    shutil.copytree(job / "out_one" / "checkpoint-2", job / "out_resume" / "checkpoint-2")
    _launch(job, "resume", 2, pretrain_config(job, "out_resume", sharding="stage2", per_device_train_batch_size=1,
                                              **base))
    _close(losses(job / "out_resume", 4), ref)
