"""The same scenarios on 2 CUDA GPUs with NCCL, fp32 (TF32 off), against one GPU.

Not run in this session (no GPU time was assigned to this part); run on a 2-GPU machine with
``python -m pytest -q tests/distributed/test_gpu_distributed.py``. Bound as in test_distributed.py: 4x the
difference between one-GPU runs that only re-associate fp32 sums (1 vs 2 micro-batches), plus one ulp.
"""

from __future__ import annotations

import pytest
import torch

from test_distributed import EPS32, _assert_close, _run  # noqa: F401  (same launcher and comparison)

pytestmark = [pytest.mark.gpu, pytest.mark.distributed,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu")
    ref = _run([{"name": "ref", "end": 4}, {"name": "ref_micro2", "end": 4, "micro": 2}], 1, tmp)
    ck = str(tmp / "ck")
    tp = {"sharding": 1, "tp": 2}
    two = _run([
        {"name": "fsdp", "layout": {"sharding": 2, "sharding_stage": "stage2"}, "end": 4},
        {"name": "tp_lp_sp", "layout": {**tp, "tensor_parallel_output": True, "sequence_parallel": True}, "end": 4},
        {"name": "save", "layout": {"sharding": 2, "sharding_stage": "stage3"}, "end": 2, "save_at": 2, "save": ck},
        {"name": "reshard_tp", "layout": tp, "start": 2, "end": 4, "load": ck},
    ], 2, tmp)
    noise = max(abs(a - b) / abs(b) for key in ("losses", "grad_norms")
                for a, b in zip(ref["ref_micro2"][key], ref["ref"][key]))
    return ref, two, 4 * noise + EPS32


@pytest.mark.parametrize("name", ["fsdp", "tp_lp_sp"])
def test_gpu_two_ranks_match_one(gpu_runs, name):
    ref, two, tol = gpu_runs
    _assert_close(two[name], ref["ref"], tol)


def test_gpu_reshard_on_load(gpu_runs):
    ref, two, tol = gpu_runs
    _assert_close(two["save"], ref["ref"], tol, 0, 2)
    _assert_close(two["reshard_tp"], ref["ref"], tol, 2, 4)
