"""The fused SFT loss under FSDP2 (2 ranks, gloo, CPU): the head's gradient reaches the FSDP-managed weight.

``sft_loss(fused=True)`` takes the head weight from ``hidden_states_and_head`` (unsharded by the root forward) and
returns its gradient from a custom autograd Function; FSDP2 must still reduce-scatter it into the sharded
parameter, also when that weight is the tied embedding. Compared with the unfused loss on the same sharded model:
losses and every gathered gradient agree to fp32 summation order (measured below 1e-6 relative; bound 1e-5).
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_fused_ce_worker.py")


def test_fused_ce_under_fsdp2_matches_unfused(tmp_path):
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(33000 + os.getpid() % 2000), WORKER, str(out)]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    res = json.loads(out.read_text())
    for kind in ("tied", "untied"):
        r = res[kind]
        assert r["same_names"] and r["n_grads"] >= 19
        assert r["loss_fused"] == pytest.approx(r["loss_unfused"], rel=1e-6)
        assert r["eval_fused"] == pytest.approx(r["eval_unfused"], rel=1e-6)
        assert r["grad_max_rel"] <= 1e-5, r
