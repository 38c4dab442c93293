"""Trainer under torchrun (2 ranks, gloo, FSDP2 sharding) vs one process on the same global batches.

2 ranks x 1 pack x 2 micro-batches and 1 process x 2 packs x 2 micro-batches see the same packs per optimizer
step (rank r takes packs r, r+2, ... of the shuffled order), so with the token count all-reduced over data
ranks and gradients summed (not averaged), per-step losses must agree up to fp32 re-association. Tolerance:
tests/distributed measured <= ~1e-6 relative between parallel and single-process runs of this size; we allow
1e-5. Also checks that an FSDP run resumed from its DCP checkpoint continues with the same losses.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer_dist_worker.py")


def _run(tmp, tag, nproc, **spec):
    spec_path, out_path = tmp / f"{tag}.json", tmp / f"{tag}.out.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, WORKER, str(spec_path), str(out_path)]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(31000 + os.getpid() % 2000)] + cmd[1:]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(out_path.read_text())


def test_two_ranks_match_one_process_and_resume(tmp_path):
    ref = _run(tmp_path, "ref", 1, output_dir=str(tmp_path / "ref"), per_device_train_batch_size=2, max_steps=4)
    dist2 = _run(tmp_path, "dp2", 2, output_dir=str(tmp_path / "dp2"), per_device_train_batch_size=1, max_steps=4)
    assert len(ref["losses"]) == 4
    assert dist2["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    assert dist2["eval_loss"] == pytest.approx(ref["eval_loss"], rel=1e-5)
    # FSDP checkpoint at step 2 (sharded DCP), then a fresh 2-rank job resumes and finishes identically
    _run(tmp_path, "part", 2, output_dir=str(tmp_path / "split"), per_device_train_batch_size=1, max_steps=4,
         stop_at=2)
    resumed = _run(tmp_path, "resumed", 2, output_dir=str(tmp_path / "split"), per_device_train_batch_size=1,
                   max_steps=4, resume=True)
    assert resumed["log_steps"] == [1, 2, 3, 4]
    assert resumed["losses"] == pytest.approx(dist2["losses"], rel=1e-6)
    assert sorted(os.listdir(tmp_path / "split" / "checkpoint-2" / "distcp")) == [".metadata", "__0_0.distcp",
                                                                                  "__1_0.distcp"]


def test_eval_counts_every_dev_pack_once_with_an_odd_dev_set(tmp_path):
    """5 dev packs on 2 ranks: no wrap-around repeat in the mean (rank 1 runs a filler pass that counts nothing),
    so the 2-rank eval loss equals the 1-process one on the same (untrained) weights."""
    one = _run(tmp_path, "e1", 1, output_dir=str(tmp_path / "e1"), per_device_train_batch_size=2, max_steps=1,
               eval_n=5, eval_only=True)
    two = _run(tmp_path, "e2", 2, output_dir=str(tmp_path / "e2"), per_device_train_batch_size=1, max_steps=1,
               eval_n=5, eval_only=True)
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-6)
