"""The PyTorch reference (flashmask.reference) against torch SDPA and a float64 oracle.

Tolerances are derived, not guessed: the float64 result is the truth, and the reference (fp32) must be within a
small multiple of the error torch's own fp32 SDPA makes on the same inputs.
"""

import pytest
import torch
import torch.nn.functional as F

from flashmask import masks as M
from flashmask.dense import to_dense
from flashmask.reference import flashmask_attention_reference


def qkv(b, s_q, s_k, h_q, h_k, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h_q, d, generator=g).to(dtype)
    k = torch.randn(b, s_k, h_k, d, generator=g).to(dtype)
    v = torch.randn(b, s_k, h_k, d, generator=g).to(dtype)
    return q, k, v


def sdpa(q, k, v, mask=None, causal=False, dtype=None, scale=None):
    """torch SDPA in [B, S, H, D] layout (GQA via enable_gqa); mask bool [B|1, H|1, S_q, S_k]."""
    t = [x.transpose(1, 2).to(dtype or x.dtype) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*t, attn_mask=mask, is_causal=causal, enable_gqa=True, scale=scale)
    return out.transpose(1, 2)


def tol(q, k, v, **kw):
    """Max abs error of fp32 SDPA against fp64 SDPA on these inputs (floored at fp32 eps)."""
    return max((sdpa(q, k, v, **kw) - sdpa(q, k, v, dtype=torch.float64, **kw).float()).abs().max().item(), 1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("h_q,h_k", [(4, 4), (4, 2), (4, 1)])
def test_plain_matches_sdpa(causal, h_q, h_k):
    q, k, v = qkv(2, 33, 33, h_q, h_k, 16)
    scale = 16 ** -0.5
    out, lse = flashmask_attention_reference(q, k, v, None, causal, scale)
    truth = sdpa(q, k, v, causal=causal, dtype=torch.float64)
    assert out.dtype == torch.float32 and out.shape == q.shape and lse.shape == (2, h_q, 33)
    assert (out.double() - truth).abs().max().item() <= 4 * tol(q, k, v, causal=causal)
    # LSE: natural-log sum of exp(scale * q.k) over the allowed keys, in float64
    def torch_lse(dtype):
        kk = k.to(dtype).repeat_interleave(h_q // h_k, 2)
        s = torch.einsum("bqhd,bkhd->bhqk", q.to(dtype), kk) * scale
        if causal:
            s = s.masked_fill(~torch.ones(33, 33, dtype=torch.bool).tril(), float("-inf"))
        return torch.logsumexp(s, -1).double()

    lse_tol = 4 * max((torch_lse(torch.float32) - torch_lse(torch.float64)).abs().max().item(), 1e-6)
    assert (lse.double() - torch_lse(torch.float64)).abs().max().item() <= lse_tol


def test_non_square_full():
    q, k, v = qkv(1, 7, 19, 2, 1, 8)
    out, _ = flashmask_attention_reference(q, k, v, M.full_mask(19, seq_q=7).startend_row_indices, False, 8 ** -0.5)
    truth = sdpa(q, k, v, dtype=torch.float64)
    assert (out.double() - truth).abs().max().item() <= 4 * tol(q, k, v)


@pytest.mark.parametrize("make", [
    lambda: M.causal_document_mask([[5, 9, 3], [17]]),
    lambda: M.document_mask([[5, 9, 3], [10, 7]]),
    lambda: M.global_sliding_window_mask(17, 2, (3, 1), batch_size=2),
    lambda: M.share_question_mask([[(3, [4, 2]), (2, [3, 3])], [(5, [6, 6])]]),
    lambda: M.random_eviction_mask(17, 0.6, num_heads=2, batch_size=2, seed=3),  # per-head masks, GQA
])
def test_masked_matches_sdpa(make):
    m = make()
    sri = m.startend_row_indices
    q, k, v = qkv(2, 17, 17, 4, 2, 8)
    out, _ = flashmask_attention_reference(q, k, v, sri, m.causal, 8 ** -0.5)
    allowed = to_dense(sri, m.causal)  # [B, H_mask, S, S]
    allowed = allowed.repeat_interleave(4 // allowed.shape[1], 1)  # mask head = q_head // (H_q / H_mask)
    live = allowed.any(-1).transpose(1, 2)[..., None]  # [B, S, H_q, 1]
    truth = sdpa(q, k, v, mask=allowed, dtype=torch.float64)
    err = (out.double() - truth).masked_fill(~live, 0).abs().max().item()
    ref_err = (sdpa(q, k, v, mask=allowed) - truth).masked_fill(~live, 0).abs().max().item()
    assert err <= 4 * max(ref_err, 1e-6)


def test_fully_masked_rows_and_columns():
    # rows 5.. and columns 5.. are padding (collator layout) and QK-sparse rows [0, 2) see nothing at all
    pad = M.causal_document_mask([3, 2], seq_len=8).startend_row_indices
    qk = M.qk_sparse_mask(8, [(0, 2)]).startend_row_indices
    for sri, empty_rows, empty_cols in [(pad, [5, 6, 7], [5, 6, 7]), (qk, [0, 1], [])]:
        q, k, v = (t.requires_grad_() for t in qkv(1, 8, 8, 2, 1, 4))
        out, lse = flashmask_attention_reference(q, k, v, sri, True, 0.5)
        assert torch.equal(out[:, empty_rows], torch.zeros_like(out[:, empty_rows]))
        assert torch.isneginf(lse[:, :, empty_rows]).all() and torch.isfinite(lse[:, :, 2:5]).all()
        out.backward(torch.randn_like(out))
        for g in (q.grad, k.grad, v.grad):
            assert torch.isfinite(g).all()
        assert (q.grad[:, empty_rows] == 0).all()
        if empty_cols:
            assert (k.grad[:, empty_cols] == 0).all() and (v.grad[:, empty_cols] == 0).all()
        assert q.grad[:, 2:5].abs().sum() > 0


def test_gradients_match_float64():
    m = M.share_question_mask([(3, [4, 2]), (2, [3, 3])], seq_len=19)  # 2 padding rows
    q, k, v = qkv(1, 19, 19, 4, 2, 8)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))

    def grads(dtype):
        leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
        out, _ = flashmask_attention_reference(*leaves, m.startend_row_indices, True, 0.3, compute_dtype=dtype)
        out.backward(dout.to(dtype))
        return [t.grad.double() for t in leaves]

    g64 = grads(torch.float64)
    # derived tolerance: same-dtype torch run (SDPA fp32 with the same dense mask, live rows only) vs float64
    allowed = to_dense(m.startend_row_indices, True)
    live = allowed.any(-1)[0, 0]

    def sdpa_grads(dtype):
        leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
        out = sdpa(*leaves, mask=allowed, scale=0.3)
        (out[:, live] * dout.to(dtype)[:, live]).sum().backward()
        return [t.grad.double() for t in leaves]

    s32, s64 = sdpa_grads(torch.float32), sdpa_grads(torch.float64)
    for ours, truth, a, b in zip(grads(torch.float32), g64, s32, s64):
        assert torch.allclose(b, truth, atol=1e-10)  # the two float64 computations agree
        assert (ours - truth).abs().max().item() <= 4 * max((a - b).abs().max().item(), 1e-6)
