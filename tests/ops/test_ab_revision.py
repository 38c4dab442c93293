"""``flashmask.benchmarks.ab_revision``: a git revision's ``ops/flashmask`` imports as a second package beside the
working tree's and computes the same attention; revisions that name no commit are refused; the paired speed is the
median of the per-repetition ratios."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

pytest.importorskip("triton")
from flashmask import masks as M  # noqa: E402
from flashmask.autograd import flashmask_attention_triton  # noqa: E402
from flashmask.benchmarks import ab_revision as ab  # noqa: E402
from test_triton import DEV, make_qkv  # noqa: E402

needs_checkout = pytest.mark.skipif(not (ab.REPO / ".git").exists(), reason="needs the git checkout of the repo")


@needs_checkout
def test_head_imports_beside_the_working_tree_and_agrees():
    base = ab.load_revision("HEAD")
    assert base.__name__.startswith("flashmask_ab_") and ab.load_revision("HEAD") is base
    assert importlib.util.find_spec(f"{base.__name__}.benchmarks") is None  # the benchmarks are left out
    m = M.causal_document_mask([[40, 24]])
    sri = m.startend_row_indices.to(DEV)
    q, k, v, do = make_qkv(1, 64, 64, 2, 1, 16, torch.float32, seed=5)
    outs = []
    for attn in (base.autograd.flashmask_attention_triton, flashmask_attention_triton):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        o = attn(*leaves, sri.clone(), m.causal, 0.25, False)[0]
        o.backward(do)
        outs.append([o.detach()] + [t.grad for t in leaves])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b)


@needs_checkout
def test_each_version_runs_its_own_kernels(monkeypatch):
    """The imported revision reaches its own ``dispatch`` (not the working tree's), through the eager function and
    the public API; the working tree's calls never reach the revision's."""
    base = ab.load_revision("HEAD")
    base_dispatch = importlib.import_module(f"{base.__name__}.dispatch")
    real_fwd, real_bwd = base_dispatch.forward, base_dispatch.backward
    calls = []
    monkeypatch.setattr(base_dispatch, "forward", lambda *a: calls.append("fwd") or real_fwd(*a))
    monkeypatch.setattr(base_dispatch, "backward", lambda *a: calls.append("bwd") or real_bwd(*a))
    q, k, v, do = make_qkv(1, 32, 32, 2, 1, 16, torch.float32, seed=6)
    q.requires_grad_(True)
    flashmask_attention_triton(q, k, v, None, True, 0.25, False)[0].backward(do)
    assert calls == []
    base.autograd.flashmask_attention_triton(q, k, v, None, True, 0.25, False)[0].backward(do)
    assert calls == ["fwd", "bwd"]
    base.flashmask_attention(q.detach(), k, v, None, causal=True, impl="triton")
    assert calls == ["fwd", "bwd", "fwd"]


@needs_checkout
def test_a_revision_that_names_no_commit_is_refused():
    with pytest.raises(ValueError, match="no-such-revision"):
        ab.load_revision("no-such-revision")


def test_a_directory_copy_imports_as_its_own_package_and_agrees(tmp_path):
    import shutil

    src, other = tmp_path / "variant", tmp_path / "elsewhere" / "variant"
    shutil.copytree(ab.REPO / "ops" / "flashmask", src)
    shutil.copytree(ab.REPO / "ops" / "flashmask", other)
    base = ab.load_revision(str(src))
    assert base.__name__.startswith("flashmask_ab_dir_variant_") and ab.load_revision(str(src)) is base
    assert ab.load_revision(str(other)) is not base  # another copy of the same folder name is its own package
    q, k, v, do = make_qkv(1, 32, 32, 2, 1, 16, torch.float32, seed=7)
    outs = [attn(q, k, v, None, True, 0.25, False)[0]
            for attn in (base.autograd.flashmask_attention_triton, flashmask_attention_triton)]
    torch.testing.assert_close(*outs)


@needs_checkout
def test_a_directory_or_file_without_the_package_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    for path in (tmp_path, tmp_path / "notes.txt"):
        with pytest.raises(ValueError, match="nor a directory holding a copy of ops/flashmask"):
            ab.load_revision(str(path))


def test_paired_speed_is_the_median_of_the_ratios():
    assert ab.paired_speed([2.0, 4.0, 6.0], [1.0, 4.0, 2.0]) == 2.0
    with pytest.raises(ValueError, match="equally long"):
        ab.paired_speed([1.0, 2.0], [1.0])
