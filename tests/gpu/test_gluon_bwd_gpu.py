"""The Gluon backward (flashmask.gluon_bwd, sm_90 only) through the public API, against the fp32 reference.

``FLASHMASK_BWD=gluon`` makes a failure of the Gluon path raise instead of falling back to the Triton kernels,
and every test checks that the Gluon launcher ran. Tolerance as tests/gpu/test_flashmask_gpu.py (2x the error of
a same-dtype PyTorch run plus a floor, tests/ops/tolerance.py).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from test_flashmask_gpu import MODES, _builder_masks, check, qkv, random_sri

pytestmark = pytest.mark.gpu


@pytest.fixture
def gluon_calls(monkeypatch):
    """Force the Gluon path and count its launches."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon backward is written for sm_90 (H100 / H200)")
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from flashmask import gluon_bwd

    monkeypatch.setenv("FLASHMASK_BWD", "gluon")
    calls = []
    real = gluon_bwd.launch

    def spy(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(gluon_bwd, "launch", spy)
    return calls


CASES = list(itertools.product([torch.bfloat16, torch.float16], range(len(MODES)), [1024, 2048]))


@pytest.mark.parametrize("dtype,mode,s", CASES, ids=[f"{str(d)[6:]}-mode{m}-S{s}" for d, m, s in CASES])
def test_gluon_random_masks(gluon_calls, dtype, mode, s):
    """Every mode (causal or not, 1 / 2 / 4 vectors, no mask), GQA 4:2 at 1024 and 8:2 at 2048, per-head masks."""
    causal, c = MODES[mode]
    b, h_q, h_k = (2, 4, 2) if s == 1024 else (1, 8, 2)
    hm = h_k if (c or 0) % 2 == 0 else 1
    sri = None if c is None else random_sri(b, hm, s, causal, c, torch.Generator().manual_seed(mode))
    q, k, v, do = qkv(b, s, h_q, h_k, 128, dtype, 100 + mode)
    check(q, k, v, do, sri, causal)
    assert gluon_calls, "the Gluon backward did not run"


@pytest.mark.parametrize("name", ["causal_document", "document", "share_question", "sliding_window",
                                  "global_sliding", "prefix_lm_causal", "prefix_lm_document", "causal_blockwise",
                                  "qk_sparse", "random_eviction_per_head"])
def test_gluon_mask_builders(gluon_calls, name):
    s = 3072
    m = _builder_masks(s)[name]
    q, k, v, do = qkv(2, s, 4, 2, 128, torch.bfloat16, 7)
    check(q, k, v, do, m.startend_row_indices.cuda(), m.causal)
    assert gluon_calls


@pytest.mark.parametrize("s_q,s_k,masked", [(1024, 2048, True), (1088, 1024, True), (576, 1024, False)])
def test_gluon_cross_lengths(gluon_calls, s_q, s_k, masked):
    """S_q != S_k (shorter and longer than S_k, and S_q % 128 == 64): a bidirectional mask with 4 vectors, or none."""
    sri = None
    if masked:
        g = torch.Generator().manual_seed(s_q + s_k)
        r = torch.sort(torch.randint(0, s_q + 1, (1, 2, s_k, 4), generator=g), dim=-1).values
        sri = torch.stack([r[..., 2], r[..., 3], r[..., 0], r[..., 1]], -1).to(torch.int32).cuda()  # LTS LTE UTS UTE
    q, _, _, do = qkv(1, s_q, 4, 2, 128, torch.bfloat16, 12)
    _, k, v, _ = qkv(1, s_k, 4, 2, 128, torch.bfloat16, 13)
    check(q, k, v, do, sri, False)
    assert gluon_calls


def test_gluon_not_used_when_deterministic_or_ineligible(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from flashmask.triton_flashmask import gluon_bwd_eligible

    q = torch.zeros(1, 1024, 2, 128, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setenv("FLASHMASK_BWD", "auto")
    assert not gluon_bwd_eligible(q, q, q, q, deterministic=True)
    assert not gluon_bwd_eligible(q[..., :64].contiguous(), q, q, q, deterministic=False)  # D = 64
    odd = torch.zeros(1 + q.numel(), device="cuda", dtype=q.dtype)[1:].view(q.shape)  # contiguous, misaligned
    assert not gluon_bwd_eligible(odd, q, q, q, deterministic=False)
    with _deterministic_algorithms():  # torch.use_deterministic_algorithms(True) asks for reproducibility too
        assert not gluon_bwd_eligible(q, q, q, q, deterministic=False)
    monkeypatch.setenv("FLASHMASK_BWD", "triton")
    assert not gluon_bwd_eligible(q, q, q, q, deterministic=False)


def test_gluon_backward_in_cuda_graph(gluon_calls):
    """Forward + backward captured in a CUDA graph: a replay equals eager, also after a new mask is copied into
    the static index tensor (the mask preprocessing is part of the graph)."""
    from flashmask import flashmask_attention
    from flashmask import masks as M

    s = 1024
    q, k, v, do = qkv(1, s, 4, 2, 128, torch.bfloat16, 21)
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    mask_a = M.causal_document_mask([[300, 500, s - 800]]).startend_row_indices.cuda()
    mask_b = M.causal_document_mask([[700, s - 700]]).startend_row_indices.cuda()
    sri = mask_a.clone()

    def step():
        out = flashmask_attention(q, k, v, sri, causal=True, impl="triton")
        return torch.autograd.grad(out, (q, k, v), do)

    def close(got, want):
        for a, b in zip(got, want):  # dQ is summed with atomics: equal up to the order of the fp32 additions
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
    close(static, eager_a)
    sri.copy_(mask_b)
    graph.replay()
    replay_b = [t.clone() for t in static]
    close(replay_b, step())
    assert gluon_calls


class _deterministic_algorithms:
    """``torch.use_deterministic_algorithms(True)`` for a block, restoring the previous setting."""

    def __enter__(self):
        self.was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.was)
