"""The Gluon kernels (flashmask.gluon_fwd and flashmask.gluon_bwd, sm_90 only) through the public API, against
the fp32 reference.

Each kernel test runs once per kernel (``gluon`` fixture: ``fwd`` or ``bwd``): ``FLASHMASK_FWD=gluon`` /
``FLASHMASK_BWD=gluon`` makes a failure of that Gluon path raise instead of falling back to Triton, and every test
checks that the Gluon launcher ran. ``check`` compares the output, LSE and all gradients with the tolerances of
tests/gpu/test_flashmask_gpu.py (2x the error of a same-dtype PyTorch run plus a floor, tests/ops/tolerance.py).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from test_flashmask_gpu import MODES, _builder_masks, check, qkv, random_sri

pytestmark = pytest.mark.gpu

ENV = {"fwd": "FLASHMASK_FWD", "bwd": "FLASHMASK_BWD"}


def _require_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernels are written for sm_90 (H100 / H200)")
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")


def _spy(monkeypatch, which: str) -> list:
    """Force the Gluon ``which`` kernel (``fwd`` / ``bwd``) and record the q shape of each of its launches."""
    from flashmask import gluon_bwd, gluon_fwd

    module = {"fwd": gluon_fwd, "bwd": gluon_bwd}[which]
    monkeypatch.setenv(ENV[which], "gluon")
    calls, real = [], module.launch

    def spy(*args, **kwargs):
        calls.append(args[0 if which == "fwd" else 1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "launch", spy)
    return calls


@pytest.fixture(params=["fwd", "bwd"])
def gluon(request, monkeypatch):
    """One Gluon kernel forced on; the list of its launches."""
    _require_hopper()
    return _spy(monkeypatch, request.param)


CASES = list(itertools.product([torch.bfloat16, torch.float16], range(len(MODES)), [1024, 2048]))


@pytest.mark.parametrize("dtype,mode,s", CASES, ids=[f"{str(d)[6:]}-mode{m}-S{s}" for d, m, s in CASES])
def test_gluon_random_masks(gluon, dtype, mode, s):
    """Every mode (causal or not, 1 / 2 / 4 vectors, no mask), GQA 4:2 at 1024 and 8:2 at 2048, per-head masks."""
    causal, c = MODES[mode]
    b, h_q, h_k = (2, 4, 2) if s == 1024 else (1, 8, 2)
    hm = h_k if (c or 0) % 2 == 0 else 1
    sri = None if c is None else random_sri(b, hm, s, causal, c, torch.Generator().manual_seed(mode))
    q, k, v, do = qkv(b, s, h_q, h_k, 128, dtype, 100 + mode)
    check(q, k, v, do, sri, causal)
    assert gluon, "the Gluon kernel did not run"


HEAD_DIM_CASES = [(w, d, m, t) for w, d in (("fwd", 64), ("fwd", 256), ("bwd", 64), ("bwd", 256))
                  for m, t in itertools.product([0, 3, 5], [torch.bfloat16, torch.float16])]


@pytest.mark.parametrize("which,d,mode,dtype", HEAD_DIM_CASES,
                         ids=[f"{w}-D{d}-mode{m}-{str(t)[6:]}" for w, d, m, t in HEAD_DIM_CASES])
def test_gluon_head_dims(monkeypatch, which, d, mode, dtype):
    """The Gluon kernels at head dims other than 128: the forward at 64 (GQA 4:1, the 1B Llama's groups) and 256
    (64-key tiles), the backward at 64 (dQ split by keys) and 256 (``gluon_bwd256``); causal without a mask, causal
    with LTS / LTE, bidirectional with four vectors."""
    _require_hopper()
    calls = _spy(monkeypatch, which)
    causal, c = MODES[mode]
    sri = None if c is None else random_sri(1, 2, 1024, causal, c, torch.Generator().manual_seed(d + mode))
    q, k, v, do = qkv(1, 1024, 8, 2, d, dtype, d + mode)
    check(q, k, v, do, sri, causal)
    assert calls, f"the Gluon {which} kernel did not run"


D256_CASES = list(itertools.product(range(len(MODES)), [1024, 2048]))


@pytest.mark.parametrize("mode,s", D256_CASES, ids=[f"mode{m}-S{s}" for m, s in D256_CASES])
def test_gluon_bwd_d256_random_masks(monkeypatch, mode, s):
    """The D = 256 backward (64-key programs, S and dP split by keys, dK / dV / dQ by head dims) in every mode, GQA
    4:2 with per-head masks at 1024 and 8:2 with one mask head at 2048 (B = 2: the dQ tiles of both batches)."""
    _require_hopper()
    calls = _spy(monkeypatch, "bwd")
    causal, c = MODES[mode]
    h_q, h_k, hm = (4, 2, 2) if s == 1024 else (8, 2, 1)
    sri = None if c is None else random_sri(2, hm, s, causal, c, torch.Generator().manual_seed(256 + mode))
    q, k, v, do = qkv(2, s, h_q, h_k, 256, torch.bfloat16, 256 + mode)
    check(q, k, v, do, sri, causal)
    assert calls, "the Gluon backward did not run"


@pytest.mark.parametrize("name", ["causal_document", "share_question", "sliding_window", "global_sliding",
                                  "prefix_lm_document", "random_eviction_per_head"])
def test_gluon_bwd_d256_mask_builders(monkeypatch, name):
    _require_hopper()
    calls = _spy(monkeypatch, "bwd")
    m = _builder_masks(3072)[name]
    q, k, v, do = qkv(2, 3072, 4, 2, 256, torch.bfloat16, 9)
    check(q, k, v, do, m.startend_row_indices.cuda(), m.causal)
    assert calls, "the Gluon backward did not run"


@pytest.mark.parametrize("l2_bytes", [3 << 17, 3 << 21], ids=["fwd-chunks-of-3", "bwd-chunks-of-3"])
@pytest.mark.parametrize("mode", [3, 5])
def test_gluon_longest_first_over_several_head_chunks(monkeypatch, l2_bytes, mode):
    """Both Gluon kernels with the rows (batch x head) split into several longest-first chunks, the last one short:
    ``LPT_L2_BYTES`` lowered so that 3 rows fit (forward: 16 query-head rows of 128 KB, chunks 3, 3, 3, 3, 3, 1;
    backward: 4 KV-head rows of 2 MB, chunks 3, 1). B = 2, GQA 8:2, a mask per batch and KV head."""
    _require_hopper()
    from flashmask import gluon_bwd

    calls = {w: _spy(monkeypatch, w) for w in ENV}
    monkeypatch.setattr(gluon_bwd, "LPT_L2_BYTES", l2_bytes)
    causal, c = MODES[mode]
    sri = random_sri(2, 2, 1024, causal, c, torch.Generator().manual_seed(40 + mode))
    q, k, v, do = qkv(2, 1024, 8, 2, 128, torch.bfloat16, 40 + mode)
    check(q, k, v, do, sri, causal)
    assert calls["fwd"] and calls["bwd"], "both Gluon kernels must run"


@pytest.mark.parametrize("name", ["causal_document", "document", "share_question", "sliding_window",
                                  "global_sliding", "prefix_lm_causal", "prefix_lm_document", "causal_blockwise",
                                  "qk_sparse", "random_eviction_per_head"])
def test_gluon_mask_builders(gluon, name):
    s = 3072
    m = _builder_masks(s)[name]
    q, k, v, do = qkv(2, s, 4, 2, 128, torch.bfloat16, 7)
    check(q, k, v, do, m.startend_row_indices.cuda(), m.causal)
    assert gluon


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("s_q,s_k,masked", [(1024, 2048, True), (2048, 1024, True), (1088, 1024, True),
                                            (576, 1024, False)])
def test_gluon_cross_lengths(gluon, s_q, s_k, masked, d):
    """S_q != S_k (shorter and longer than S_k; S_q % 128 == 64 runs the Triton forward) with a bidirectional
    4-vector mask whose rows may see nothing (LSE -inf, O = 0), or none; head dims 128 and 256."""
    sri = None
    if masked:
        g = torch.Generator().manual_seed(s_q + s_k)
        r = torch.sort(torch.randint(0, s_q + 1, (1, 2, s_k, 4), generator=g), dim=-1).values
        sri = torch.stack([r[..., 2], r[..., 3], r[..., 0], r[..., 1]], -1).to(torch.int32).cuda()  # LTS LTE UTS UTE
    q, _, _, do = qkv(1, s_q, 4, 2, d, torch.bfloat16, 12)
    _, k, v, _ = qkv(1, s_k, 4, 2, d, torch.bfloat16, 13)
    check(q, k, v, do, sri, False)
    assert gluon or s_q % 128, "the Gluon kernel did not run"


def test_gluon_scope(monkeypatch):
    """Where each Gluon kernel applies: the default (unset) is auto for both; ``triton`` turns each off; the
    forward and the backward take head dims 64, 128 and 256; other head dims, a misaligned tensor,
    S_q % 128 != 0 (forward) and reproducible backwards run the Triton kernels."""
    _require_hopper()
    from flashmask.dispatch import gluon_bwd_eligible, gluon_fwd_eligible

    q = torch.zeros(1, 1024, 2, 128, device="cuda", dtype=torch.bfloat16)
    d64 = q[..., :64].contiguous()
    odd = torch.zeros(1 + q.numel(), device="cuda", dtype=q.dtype)[1:].view(q.shape)  # contiguous, misaligned
    for name in ENV.values():
        monkeypatch.delenv(name, raising=False)
    assert gluon_fwd_eligible(q, q, q) and gluon_bwd_eligible(q, q, q, q, deterministic=False)
    assert not gluon_fwd_eligible(q[:, :960].contiguous(), q, q)  # S_q % 128 == 64
    d256 = torch.zeros(1, 1024, 2, 256, device="cuda", dtype=torch.bfloat16)
    d96 = q[..., :96].contiguous()
    assert gluon_fwd_eligible(d64, d64, d64) and gluon_fwd_eligible(d256, d256, d256)
    assert gluon_bwd_eligible(d64, d64, d64, d64, deterministic=False)
    assert gluon_bwd_eligible(d256, d256, d256, d256, deterministic=False)
    assert not gluon_fwd_eligible(d96, d96, d96) and not gluon_bwd_eligible(d96, d96, d96, d96, deterministic=False)
    assert not gluon_fwd_eligible(odd, q, q) and not gluon_bwd_eligible(odd, q, q, q, deterministic=False)
    assert not gluon_bwd_eligible(q, q, q, q, deterministic=True)
    with _deterministic_algorithms():  # torch.use_deterministic_algorithms(True) asks for reproducibility too
        assert not gluon_bwd_eligible(q, q, q, q, deterministic=False)
    for name in ENV.values():
        monkeypatch.setenv(name, "triton")
    assert not gluon_fwd_eligible(q, q, q) and not gluon_bwd_eligible(q, q, q, q, deterministic=False)


def test_gluon_in_cuda_graph(monkeypatch):
    """Forward + backward, both Gluon, captured in a CUDA graph: a replay equals eager (the output bitwise, the
    gradients up to the order of dQ's fp32 reduce-adds), also after a new mask is copied into the static index
    tensor (the mask preprocessing is part of the graph)."""
    _require_hopper()
    from flashmask import flashmask_attention
    from flashmask import masks as M

    calls = {w: _spy(monkeypatch, w) for w in ENV}
    s = 1024
    q, k, v, do = qkv(1, s, 4, 2, 128, torch.bfloat16, 21)
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    mask_a = M.causal_document_mask([[300, 500, s - 800]]).startend_row_indices.cuda()
    mask_b = M.causal_document_mask([[700, s - 700]]).startend_row_indices.cuda()
    sri = mask_a.clone()

    def step():
        out = flashmask_attention(q, k, v, sri, causal=True, impl="triton")
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), do))

    def same(got, want):
        assert torch.equal(got[0], want[0])  # no atomics in the forward
        for a, b in zip(got[1:], want[1:]):
            torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)

    eager_a = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    graph.replay()
    same(static, eager_a)
    sri.copy_(mask_b)
    graph.replay()
    replay_b = [t.clone() for t in static]
    same(replay_b, step())
    assert calls["fwd"] and calls["bwd"]


class _deterministic_algorithms:
    """``torch.use_deterministic_algorithms(True)`` for a block, restoring the previous setting."""

    def __enter__(self):
        self.previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.previous)


def test_repeated_launches_reuse_the_compiled_kernels(monkeypatch):
    """The second forward + backward of a shape calls the kept Gluon kernels directly (no ``kernel[grid]``; on
    Triton 3.6 through the C launcher, with descriptors encoded once per base address), inputs at other addresses
    give bitwise the same O, dK and dV, and so does Triton's own launch path."""
    _require_hopper()
    from flashmask import flashmask_attention, gluon_bwd, gluon_fwd, launch_cache
    from flashmask import masks as M

    for w in ENV:
        monkeypatch.setenv(ENV[w], "gluon")
    kernels = (gluon_fwd.flashmask_fwd_gluon_kernel, gluon_bwd.flashmask_bwd_gluon_kernel)
    q, k, v, do = qkv(1, 2048, 8, 2, 128, torch.bfloat16, 5)
    sri = M.causal_document_mask([[700, 900, 448]]).startend_row_indices.cuda()

    def step(scale, pad=0):
        """Inputs ``pad`` elements into fresh buffers: other base addresses (16-byte aligned for pad % 8 == 0)."""
        ins = []
        for t in (q, k, v):
            x = torch.empty(t.numel() + pad, dtype=t.dtype, device=t.device)[pad:].view(t.shape)
            ins.append(x.copy_(t * scale).requires_grad_(True))
        out = flashmask_attention(*ins, sri, causal=True, impl="triton")
        return (out.detach(), *torch.autograd.grad(out, ins, do))

    launch_cache.clear()
    step(1.0)
    kept = {id(e.kernel): e for e in launch_cache._cache.values()}
    assert set(kept) >= {id(kn) for kn in kernels}
    raw_calls = []
    if launch_cache._RAW_LAYOUT:  # count the launches that go through the C launchers of the Gluon kernels
        for kn in kernels:
            entry = kept[id(kn)]
            assert entry.raw is not None
            entry.raw = (lambda c_launch: lambda *a: raw_calls.append(1) or c_launch(*a))(entry.raw)
    binds = []
    real = type(kernels[0]).__getitem__
    monkeypatch.setattr(type(kernels[0]), "__getitem__",
                        lambda self, grid: (binds.append(self) if self in kernels else None) or real(self, grid))
    direct = step(0.5)
    moved = step(0.25, pad=64)  # other values at other addresses: a map left on an old address reads old values
    assert binds == []
    assert len(raw_calls) == (4 if launch_cache._RAW_LAYOUT else 0)
    launch_cache.clear()
    monkeypatch.setattr(launch_cache, "_RAW_LAYOUT", False)
    through_triton = step(0.5), step(0.25, pad=64)
    assert len(binds) == 2
    for ours, theirs in zip((direct, moved), through_triton):
        assert torch.equal(ours[0], theirs[0])
        assert torch.equal(ours[2], theirs[2]) and torch.equal(ours[3], theirs[3])  # dK, dV: one program each
        torch.testing.assert_close(ours[1].float(), theirs[1].float(), atol=2e-2, rtol=2e-2)  # dQ: reduce-adds
    launch_cache.clear()
