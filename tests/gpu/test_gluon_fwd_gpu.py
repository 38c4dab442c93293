"""The Gluon forward (flashmask.gluon_fwd, sm_90 only) through the public API, against the fp32 reference.

``FLASHMASK_FWD=gluon`` makes a failure of the Gluon path raise instead of falling back to the Triton kernel, and
every test checks that the Gluon launcher ran (outputs, LSE and the gradients that flow from them are compared,
with the tolerances of tests/gpu/test_flashmask_gpu.py).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from test_flashmask_gpu import MODES, _builder_masks, check, qkv, random_sri

pytestmark = pytest.mark.gpu


@pytest.fixture
def gluon_fwd_calls(monkeypatch):
    """Force the Gluon forward and count its launches."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon forward is written for sm_90 (H100 / H200)")
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from flashmask import gluon_fwd

    monkeypatch.setenv("FLASHMASK_FWD", "gluon")
    calls = []
    real = gluon_fwd.launch

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(gluon_fwd, "launch", spy)
    return calls


CASES = list(itertools.product([torch.bfloat16, torch.float16], range(len(MODES)), [1024, 2048]))


@pytest.mark.parametrize("dtype,mode,s", CASES, ids=[f"{str(d)[6:]}-mode{m}-S{s}" for d, m, s in CASES])
def test_gluon_fwd_random_masks(gluon_fwd_calls, dtype, mode, s):
    """Every mode (causal or not, 1 / 2 / 4 vectors, no mask), GQA 4:2 at 1024 and 8:2 at 2048, per-head masks."""
    causal, c = MODES[mode]
    b, h_q, h_k = (2, 4, 2) if s == 1024 else (1, 8, 2)
    hm = h_k if (c or 0) % 2 == 0 else 1
    sri = None if c is None else random_sri(b, hm, s, causal, c, torch.Generator().manual_seed(mode))
    q, k, v, do = qkv(b, s, h_q, h_k, 128, dtype, 200 + mode)
    check(q, k, v, do, sri, causal)
    assert gluon_fwd_calls, "the Gluon forward did not run"


@pytest.mark.parametrize("name", ["causal_document", "document", "share_question", "sliding_window",
                                  "global_sliding", "prefix_lm_causal", "prefix_lm_document", "causal_blockwise",
                                  "qk_sparse", "random_eviction_per_head"])
def test_gluon_fwd_mask_builders(gluon_fwd_calls, name):
    s = 3072
    m = _builder_masks(s)[name]
    q, k, v, do = qkv(2, s, 4, 2, 128, torch.bfloat16, 8)
    check(q, k, v, do, m.startend_row_indices.cuda(), m.causal)
    assert gluon_fwd_calls


@pytest.mark.parametrize("s_q,s_k", [(1024, 2048), (2048, 1024)])
def test_gluon_fwd_cross_lengths(gluon_fwd_calls, s_q, s_k):
    """S_q != S_k with a bidirectional 4-vector mask whose rows may see nothing (LSE -inf, O = 0)."""
    g = torch.Generator().manual_seed(s_q + s_k)
    r = torch.sort(torch.randint(0, s_q + 1, (1, 2, s_k, 4), generator=g), dim=-1).values
    sri = torch.stack([r[..., 2], r[..., 3], r[..., 0], r[..., 1]], -1).to(torch.int32).cuda()  # LTS LTE UTS UTE
    q, _, _, do = qkv(1, s_q, 4, 2, 128, torch.bfloat16, 14)
    _, k, v, _ = qkv(1, s_k, 4, 2, 128, torch.bfloat16, 15)
    check(q, k, v, do, sri, False)
    assert gluon_fwd_calls


def test_gluon_fwd_scope(monkeypatch):
    """Outside its scope (S_q % 128 != 0, D = 64) or with FLASHMASK_FWD=triton the Triton forward runs; unset
    means auto."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from flashmask.triton_flashmask import gluon_fwd_eligible

    q = torch.zeros(1, 1024, 2, 128, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setenv("FLASHMASK_FWD", "auto")
    assert gluon_fwd_eligible(q, q, q)
    assert not gluon_fwd_eligible(q[:, :960].contiguous(), q, q)  # S_q % 128 == 64
    assert not gluon_fwd_eligible(q[..., :64].contiguous(), q[..., :64].contiguous(), q[..., :64].contiguous())
    monkeypatch.setenv("FLASHMASK_FWD", "triton")
    assert not gluon_fwd_eligible(q, q, q)
    monkeypatch.delenv("FLASHMASK_FWD")
    assert gluon_fwd_eligible(q, q, q)


def test_gluon_fwd_in_cuda_graph(gluon_fwd_calls):
    """The forward captured in a CUDA graph equals eager, also after a new mask is copied into the index tensor."""
    from flashmask import flashmask_attention
    from flashmask import masks as M

    s = 1024
    q, k, v, _ = qkv(1, s, 4, 2, 128, torch.bfloat16, 22)
    mask_a = M.causal_document_mask([[300, 500, s - 800]]).startend_row_indices.cuda()
    mask_b = M.causal_document_mask([[700, s - 700]]).startend_row_indices.cuda()
    sri = mask_a.clone()

    def step():
        return flashmask_attention(q, k, v, sri, causal=True, impl="triton")

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
    assert torch.equal(static, eager_a)  # no atomics: bitwise
    sri.copy_(mask_b)
    graph.replay()
    assert torch.equal(static, step())
    assert gluon_fwd_calls
