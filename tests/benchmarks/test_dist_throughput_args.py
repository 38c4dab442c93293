"""``benchmarks/dist_throughput.py`` without a GPU: the real shapes stop at once with a pointer to ``--tiny``
(not a silent build of the 1B model on the CPU, for minutes)."""

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_real_shapes_without_gpu_point_at_tiny():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "ops"), ROOT]))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "dist_throughput.py")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--tiny" in r.stderr
