"""A second copy of the flashmask package imported under another name (the tile sweep's ``--alt name=path`` copies,
``flashmask.benchmarks.tune_blocks``) keeps its own custom ops: ``torch.library.custom_op`` silently replaces the
kernels of an op name that already exists, so with one shared ``flashmask::triton_fwd`` name both copies would run
the last-imported copy's code (an A/B would compare a copy with itself)."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
import flashmask.autograd as main_tf  # noqa: E402
from test_triton import make_qkv  # noqa: E402


def test_second_package_copy_does_not_replace_the_ops(tmp_path, monkeypatch):
    shutil.copytree(Path(main_tf.__file__).parent, tmp_path / "flashmask_ctl",
                    ignore=shutil.ignore_patterns("__pycache__", "benchmarks"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        ctl = importlib.import_module("flashmask_ctl.autograd")
        ctl_dispatch = importlib.import_module("flashmask_ctl.dispatch")

        def copy_fwd(*args):
            raise AssertionError("the main package's op ran the copy's forward")

        def copy_bwd(*args):
            raise AssertionError("the main package's op ran the copy's backward")

        monkeypatch.setattr(ctl_dispatch, "forward", copy_fwd)
        monkeypatch.setattr(ctl_dispatch, "backward", copy_bwd)
        q, k, v, do = make_qkv(1, 16, 16, 2, 1, 16, torch.float32)
        q.requires_grad_(True)
        out, _ = main_tf.flashmask_attention_triton(q, k, v, None, True, 0.25)
        out.backward(do)  # must run the main package's forward / backward
        with pytest.raises(AssertionError, match="copy's forward"):
            ctl.flashmask_attention_triton(q, k, v, None, True, 0.25)  # and the copy its own
    finally:
        for name in [m for m in sys.modules if m == "flashmask_ctl" or m.startswith("flashmask_ctl.")]:
            del sys.modules[name]
