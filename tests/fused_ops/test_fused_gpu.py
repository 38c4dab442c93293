"""Fused ops on CUDA (torch.compile -> Triton), against eager PyTorch in the same dtype. Skipped without a GPU.

Bounds are derived from same-dtype eager runs against an fp64 run: the fused result may be off by at most a small
multiple of the eager result's own error (fp32: 4x + 16 ulps of the largest value: Inductor contracts to FMAs
and re-associates the RMSNorm sum, measured 7 ulps on the H200 where eager fp32 is exact; bf16: 1.5x in relative Frobenius norm + one bf16
rounding), so a wrong formula (a missing cast, a dropped ignore mask) fails while re-association passes.
"""

import pytest
import torch
import torch.nn.functional as F

from paddlenlp_ext.ops import elementwise, fused_linear_cross_entropy

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _grads(fn, xs, amp=False):
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in xs]
    with torch.autocast(DEV, dtype=torch.bfloat16, enabled=amp):
        out = fn(*xs)
    out = out if isinstance(out, tuple) else (out,)
    g = torch.Generator(device=DEV).manual_seed(0)
    sum((o.float() * torch.randn(o.shape, device=DEV, generator=g)).sum() for o in out).backward()
    return [o.detach() for o in out] + [x.grad for x in xs if x.grad is not None]


def _within(got, ref, truth, bf16: bool):
    for g, r, t in zip(got, ref, truth):
        g, r, t = g.double(), r.double(), t.double()
        if bf16:
            assert (g - t).norm() <= 1.5 * (r - t).norm() + 2 ** -8 * t.norm() / t.numel() ** 0.5
        else:
            assert (g - t).abs().max() <= 4 * (r - t).abs().max() + 16 * 2 ** -23 * t.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_elementwise_ops_on_cuda(dtype):
    g = torch.Generator(device=DEV).manual_seed(0)
    for seq in (512, 768, 1024):  # a second shape recompiles once with dynamic sizes; the third reuses it
        x = torch.randn(2, seq, 256, device=DEV, generator=g).to(dtype)
        w = (torch.rand(256, device=DEV, generator=g) + 0.5).to(dtype)
        q = torch.randn(2, seq, 8, 64, device=DEV, generator=g).to(dtype)
        k = torch.randn(2, seq, 2, 64, device=DEV, generator=g).to(dtype)
        ang = torch.rand(2, seq, 64, device=DEV, generator=g) * 50
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        gate, up = (torch.randn(2, seq, 512, device=DEV, generator=g).to(dtype) for _ in range(2))
        for fused, eager, xs, extra in ((elementwise.fused_rms_norm, elementwise.rms_norm_eager, (x, w), (1e-5,)),
                                        (elementwise.fused_rope, elementwise.rope_eager, (q, k, cos, sin), ()),
                                        (elementwise.fused_swiglu, elementwise.swiglu_eager, (gate, up), ())):
            got = _grads(lambda *a: fused(*a, *extra), xs)
            ref = _grads(lambda *a: eager(*a, *extra), xs)
            truth = _grads(lambda *a: eager(*a, *extra), [t.double() for t in xs])
            _within(got, ref, truth, dtype == torch.bfloat16)
    assert elementwise._failed == set()


@pytest.mark.parametrize("amp", [False, True])
def test_fused_linear_ce_on_cuda(amp):
    g = torch.Generator(device=DEV).manual_seed(1)
    n, e, v = 3000, 256, 50257
    h = torch.randn(n, e, device=DEV, generator=g)
    w = torch.randn(v, e, device=DEV, generator=g) * 0.05
    labels = torch.randint(0, v, (n,), device=DEV, generator=g)
    labels[torch.rand(n, device=DEV, generator=g) < 0.4] = -100

    def ref_fn(h, w):
        return F.cross_entropy(F.linear(h, w).float(), labels, ignore_index=-100, reduction="sum")

    got = _grads(lambda h, w: fused_linear_cross_entropy(h, w, labels, chunk_size=1024), [h, w], amp)
    ref = _grads(ref_fn, [h, w], amp)
    truth = _grads(ref_fn, [h.double(), w.double()])
    _within(got, ref, truth, amp)
    assert elementwise._failed == set()
