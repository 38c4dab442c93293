"""paddlenlp_ext.ops.fused_linear_cross_entropy against ``F.cross_entropy(F.linear(h, W, b).float())``.

Tolerances come from same-dtype PyTorch runs: the unfused formula in the same dtype is compared with an fp64
run, and the fused result must be within a small multiple of that error (fp32: 4x plus 1 ulp-scale floor; bf16
autocast: 1.5x of the unfused path's relative Frobenius error plus the bf16 rounding of one element).
"""

import pytest
import torch
import torch.nn.functional as F

from paddlenlp_ext.ops import default_chunk_size, fused_linear_cross_entropy

N, E, V = 37, 16, 53


def _case(seed=0, n=N, bias=False, ignore_frac=0.3, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, E, generator=g, dtype=dtype)
    w = torch.randn(V, E, generator=g, dtype=dtype) * 0.5
    b = torch.randn(V, generator=g, dtype=dtype) if bias else None
    labels = torch.randint(0, V, (n,), generator=g)
    labels[torch.rand(n, generator=g) < ignore_frac] = -100
    return h, w, b, labels


def _grads(fn, h, w, b, labels, amp=False):
    """Loss and grads of ``fn(h, w, b, labels)`` (fresh leaves); loss scaled by 0.37 to exercise grad_output."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (h, w, b)]
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else torch.autocast("cpu", enabled=False)
    with ctx:
        loss = fn(*leaves, labels)
    (loss * 0.37).backward()
    return [loss.detach()] + [t.grad for t in leaves if t is not None]


def _ref(h, w, b, labels):
    return F.cross_entropy(F.linear(h, w, b).float(), labels, ignore_index=-100, reduction="sum")


def _fused(chunk, **kw):
    return lambda h, w, b, labels: fused_linear_cross_entropy(h, w, labels, b, chunk_size=chunk, **kw)


@pytest.mark.parametrize("chunk", [1, 5, 7, 36, 37, 100, None])
@pytest.mark.parametrize("bias", [False, True])
def test_fp32_matches_cross_entropy(chunk, bias):
    h, w, b, labels = _case(bias=bias)
    truth = _grads(_ref, *(t.double() if t is not None else None for t in (h, w, b)), labels)
    ref = _grads(_ref, h, w, b, labels)
    got = _grads(_fused(chunk), h, w, b, labels)
    for r, g, t in zip(ref, got, truth):
        bound = 4 * (r.double() - t).abs().max() + 1e-6 * t.abs().max()
        assert (g.double() - t).abs().max() <= bound


@pytest.mark.parametrize("chunk", [8, 13, None])
def test_bf16_autocast_within_unfused_error(chunk):
    h, w, b, labels = _case(seed=1, n=64, bias=True)
    truth = _grads(_ref, *(t.double() for t in (h, w, b)), labels)
    ref = _grads(_ref, h, w, b, labels, amp=True)
    got = _grads(_fused(chunk), h, w, b, labels, amp=True)
    assert got[1].dtype == h.dtype and got[2].dtype == w.dtype  # grads in the leaves' dtypes (fp32)
    for r, g, t in zip(ref, got, truth):
        err_ref = (r.double() - t).norm() / t.norm()
        err_got = (g.double() - t).norm() / t.norm()
        assert err_got <= 1.5 * err_ref + 2 ** -8 / (t.numel() ** 0.5), (err_got, err_ref)
    # forward: the logits are the same bf16 products, so the losses agree to fp32 summation order
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-4)


def test_all_labels_ignored_gives_zero_loss_and_grads():
    h, w, _, labels = _case(ignore_frac=1.1)
    assert (labels == -100).all()
    for skip in (False, True):
        loss, gh, gw = _grads(_fused(5, skip_ignored=skip), h, w, None, labels)
        assert loss.item() == 0.0 and gh.abs().max() == 0 and gw.abs().max() == 0
        assert gh.shape == h.shape and gw.shape == w.shape


def test_skip_ignored_rows_same_result():
    h, w, b, labels = _case(seed=2, bias=True, ignore_frac=0.5)
    a = _grads(_fused(6), h, w, b, labels)
    s = _grads(_fused(6, skip_ignored=True), h, w, b, labels)
    for x, y in zip(a, s):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_tied_embedding_gradient_sums_both_uses():
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(V, E, generator=g)
    ids = torch.randint(0, V, (N,), generator=g)
    labels = torch.randint(0, V, (N,), generator=g)

    def run(loss_fn):
        w = emb.clone().requires_grad_(True)
        h = torch.tanh(F.embedding(ids, w))  # the head weight is the embedding weight
        loss_fn(h, w).backward()
        return w.grad

    ref = run(lambda h, w: _ref(h, w, None, labels))
    got = run(lambda h, w: fused_linear_cross_entropy(h, w, labels, chunk_size=4))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_frozen_head_and_no_grad():
    h, w, _, labels = _case(seed=4)
    hh = h.clone().requires_grad_(True)
    loss = fused_linear_cross_entropy(hh, w, labels, chunk_size=8)  # w frozen: no [V, E] gradient buffer
    loss.backward()
    assert w.grad is None and hh.grad is not None
    with torch.no_grad():
        ev = fused_linear_cross_entropy(h, w, labels, chunk_size=8)
    torch.testing.assert_close(ev, _ref(h, w, None, labels), rtol=1e-6, atol=1e-5)
    assert not ev.requires_grad


def test_leading_dims_and_errors():
    h, w, _, labels = _case(seed=5, n=36)
    got = fused_linear_cross_entropy(h.view(4, 9, E), w, labels.view(4, 9))
    torch.testing.assert_close(got, _ref(h, w, None, labels), rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="disagree on E"):
        fused_linear_cross_entropy(h, w[:, :8], labels)
    with pytest.raises(ValueError, match="leading"):
        fused_linear_cross_entropy(h, w, labels[:5])
    with pytest.raises(ValueError, match="chunk_size"):
        fused_linear_cross_entropy(h, w, labels, chunk_size=0)


def test_default_chunk_size_bounds_fp32_logits_to_1gib():
    c = default_chunk_size(128256)
    assert c * 128256 * 4 <= 2 ** 30 < (c + 1) * 128256 * 4
    assert default_chunk_size(10 ** 12) == 1


@pytest.mark.parametrize("amp", [False, True])
def test_compiled_chunk_kernel_matches_eager(compile_on_cpu, amp):
    """The per-chunk loss/softmax-grad function as CUDA runs it (compiled; Inductor on CPU here) against the
    eager in-place one: fp32 within 4x the eager error vs fp64, bf16 within 1.5x the unfused error."""
    h, w, b, labels = _case(seed=6, n=50, bias=True)
    truth = _grads(_ref, *(t.double() for t in (h, w, b)), labels)
    got = _grads(_fused(16), h, w, b, labels, amp=amp)  # chunks 16, 16, 16, 2: a static and a dynamic graph
    assert compile_on_cpu._failed == set() and compile_on_cpu._compiled
    compile_on_cpu.COMPILE_ON_CPU = False
    eager = _grads(_fused(16), h, w, b, labels, amp=amp)
    ref = _grads(_ref, h, w, b, labels, amp=amp)
    for g, e, r, t in zip(got, eager, ref, truth):
        if amp:
            assert (g.double() - t).norm() <= 1.5 * (r.double() - t).norm() + 2 ** -8 * t.norm() / t.numel() ** 0.5
        else:
            assert (g.double() - t).abs().max() <= 4 * (e.double() - t).abs().max() + 4 * 2 ** -23 * t.abs().max()
