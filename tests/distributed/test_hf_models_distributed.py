"""Qwen2 (sliding layers) and Mistral (a window on every layer) through ``transformers`` + FlashMask under torchrun
with 2 gloo processes: FSDP2 (``sharding``) and tensor parallelism match one process step by step."""

import pytest
import torch

import os

import test_distributed

pytestmark = pytest.mark.distributed

FAMILIES = ("qwen2", "mistral")
LAYOUTS = {"fsdp": {"sharding": 2, "sharding_stage": "stage2"}, "tp": {"tp": 2}, "tp_dtensor": {"tp": 2,
                                                                                             "tp_impl": "dtensor"}}


def _run(spec, nproc, tmp, tag):
    worker, test_distributed.WORKER = test_distributed.WORKER, os.path.join(test_distributed.HERE, "hf_worker.py")
    try:
        return test_distributed._run(spec, nproc, tmp, tag)
    finally:
        test_distributed.WORKER = worker


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hfdist")
    one = _run([{"name": f, "model": f, "end": 3} for f in FAMILIES], 1, tmp, "hf")
    two = _run([{"name": f"{f}_{lay}", "model": f, "end": 3, "layout": LAYOUTS[lay]} for f in FAMILIES
                for lay in LAYOUTS], 2, tmp, "hf")
    return one, two


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_processes_match_one(runs, family, layout):
    one, two = runs
    ref, got = one[family], two[f"{family}_{layout}"]
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]), rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(got["grad_norms"]), torch.tensor(ref["grad_norms"]), rtol=2e-4, atol=1e-6)
