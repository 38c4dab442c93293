"""FlexAttention bridge (flashmask.flex): mask_mod, BlockMask from min/max, and flex_attention vs the reference.

Runs FlexAttention eagerly on CPU (torch >= 2.6: the unfused math path).
"""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

from flashmask import masks as M
from flashmask.dense import to_dense
from flashmask.flex import flashmask_block_mask, flashmask_mask_mod, flex_flashmask_attention
from flashmask.reference import flashmask_attention_reference

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

S = 45  # not a multiple of the block sizes used below
MASKS = {
    "causal": lambda: M.causal_mask(S, batch_size=2),
    "full": lambda: M.full_mask(S),
    "sliding_causal": lambda: M.sliding_window_mask(S, 7),
    "sliding_bidir": lambda: M.sliding_window_mask(S, (5, 3), causal=False),
    "causal_document": lambda: M.causal_document_mask([[10, 20, 15], [8, 8, 8, 8]], seq_len=S),
    "document": lambda: M.document_mask([[10, 20, 15], [30, 5]], seq_len=S),
    "share_question": lambda: M.share_question_mask([[(8, [10, 6]), (5, [7, 9])], [(12, [20, 10])]], seq_len=S),
    "global_sliding": lambda: M.global_sliding_window_mask(S, 3, (4, 2)),
    "causal_blockwise": lambda: M.causal_blockwise_mask([[10, 20, 15], [16, 29]]),
    "prefix_lm_document": lambda: M.prefix_lm_document_mask([[20, 25], [45]], [[5, 10], [17]]),
    "qk_sparse": lambda: M.qk_sparse_mask(S, [(4, 20), (30, 41)]),
    "random_eviction": lambda: M.random_eviction_mask(S, 0.5, num_heads=2, batch_size=2, seed=1),
    "key_padding": lambda: M.key_padding_mask([40, 45], S),
}
H_Q, H_K = 4, 2


def assert_matches_reference(out, q, k, v, sri, causal, scale):
    """out within 4x the fp32 reference's own error against the float64 reference (floor 1e-6)."""
    ref, _ = flashmask_attention_reference(q, k, v, sri, causal, scale)
    r64, _ = flashmask_attention_reference(*(t.double() for t in (q, k, v)), sri, causal, scale,
                                           compute_dtype=torch.float64)
    tol = 4 * max((ref.double() - r64).abs().max().item(), 1e-6)
    assert (out.double() - r64).abs().max().item() <= tol


def expected_dense(m):
    """bool [B, H_Q, S, S] from the FlashMask (mask head = q head // (H_Q / H_mask))."""
    d = to_dense(m.startend_row_indices, m.causal)
    return d.repeat_interleave(H_Q // d.shape[1], dim=1)


@pytest.mark.parametrize("name", list(MASKS))
def test_mask_mod_equals_dense(name):
    m = MASKS[name]()
    mod = flashmask_mask_mod(m.startend_row_indices, m.causal, num_heads=H_Q)
    exp = expected_dense(m)
    got = create_mask(mod, exp.shape[0], H_Q, S, S, device="cpu")
    assert torch.equal(got, exp)


def block_sets(bm):
    """(partial, full) as bool [B, H, Tr, Tc] from a BlockMask's ordered index lists."""
    out = []
    for num, idx in ((bm.kv_num_blocks, bm.kv_indices), (bm.full_kv_num_blocks, bm.full_kv_indices)):
        pos = torch.arange(idx.shape[-1])
        dense = torch.zeros(idx.shape, dtype=torch.bool)
        dense.scatter_(-1, idx.long(), pos < num[..., None])
        out.append(dense)
    return out


@pytest.mark.parametrize("block", [16, (8, 16)])
@pytest.mark.parametrize("name", list(MASKS))
def test_block_mask_from_min_max(name, block):
    m = MASKS[name]()
    ours = flashmask_block_mask(m.startend_row_indices, m.causal, num_heads=H_Q, block_size=block)
    mod = flashmask_mask_mod(m.startend_row_indices, m.causal, num_heads=H_Q)
    b, hm = m.startend_row_indices.shape[:2]
    ref = create_block_mask(mod, b, H_Q if hm > 1 else 1, S, S, device="cpu", BLOCK_SIZE=block)
    assert ours.shape == ref.shape and ours.BLOCK_SIZE == ref.BLOCK_SIZE
    (op, of), (rp, rf) = block_sets(ours), block_sets(ref)
    # min/max classification is sound: our full tiles are full, our skipped tiles empty; undecided -> partial
    assert bool((of <= rf).all()) and bool((rp <= op).all())
    extra = op & ~rp  # partial here, full or empty in create_block_mask
    bq, bkv = (block, block) if isinstance(block, int) else block
    dense = expected_dense(m)
    for bi, h, r, c in extra.nonzero().tolist():
        tile = dense[min(bi, dense.shape[0] - 1), h, r * bq:(r + 1) * bq, c * bkv:(c + 1) * bkv]
        assert not tile.any() or (tile.all() and rf[bi, h, r, c])
    if not extra.any():  # classification exact on this mask: the BlockMasks are identical, index lists included
        for attr in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                     "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
            assert torch.equal(getattr(ours, attr).expand_as(getattr(ref, attr)), getattr(ref, attr)), attr


def test_exact_for_document_masks():
    # documents, windows and plain masks must not need the conservative fallback
    for name in ("causal", "full", "sliding_causal", "sliding_bidir", "causal_document", "document"):
        m = MASKS[name]()
        ours = flashmask_block_mask(m.startend_row_indices, m.causal, num_heads=H_Q, block_size=16)
        mod = flashmask_mask_mod(m.startend_row_indices, m.causal, num_heads=H_Q)
        ref = create_block_mask(mod, m.startend_row_indices.shape[0], 1, S, S, device="cpu", BLOCK_SIZE=16)
        assert torch.equal(ours.kv_num_blocks, ref.kv_num_blocks), name
        assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks), name


def make_inputs(name, device="cpu", dtype=torch.float32, requires_grad=False):
    m = MASKS[name]()
    b = 2
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, S, H_Q, 16, generator=g).to(device, dtype).requires_grad_(requires_grad)
    k = torch.randn(b, S, H_K, 16, generator=g).to(device, dtype).requires_grad_(requires_grad)
    v = torch.randn(b, S, H_K, 16, generator=g).to(device, dtype).requires_grad_(requires_grad)
    sri = m.startend_row_indices.expand(b, -1, -1, -1).contiguous().to(device)
    return m, q, k, v, sri


REF_NAMES = ["causal_document", "share_question", "global_sliding", "random_eviction", "qk_sparse", "key_padding",
             "prefix_lm_document"]


@pytest.mark.parametrize("name", REF_NAMES)
def test_flex_attention_equals_reference(name):
    # FlexAttention has no backward on CPU (torch 2.13 raises NotImplementedError): forward only here
    m, q, k, v, sri = make_inputs(name)
    out, lse = flex_flashmask_attention(q, k, v, sri, m.causal, 0.25, block_size=16, return_softmax_lse=True)
    ref, ref_lse = flashmask_attention_reference(q, k, v, sri, m.causal, 0.25)
    assert out.shape == ref.shape and lse.shape == ref_lse.shape
    assert_matches_reference(out, q, k, v, sri, m.causal, 0.25)
    live = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), live)  # empty rows: -inf in both
    _, lse64 = flashmask_attention_reference(*(t.double() for t in (q, k, v)), sri, m.causal, 0.25,
                                             compute_dtype=torch.float64)
    # the reference rounds its LSE to fp32 by contract, so this tolerance is mostly the 1e-6 floor (x4)
    lse_tol = 4 * max((ref_lse.double() - lse64)[live].abs().max().item(), 1e-6)
    assert (lse.double() - lse64)[live].abs().max().item() <= lse_tol
    assert torch.equal(out[~live.transpose(1, 2)], torch.zeros_like(out[~live.transpose(1, 2)]))


@pytest.mark.gpu
@pytest.mark.parametrize("name", REF_NAMES)
def test_flex_attention_gradients_cuda(name):
    m, q, k, v, sri = make_inputs(name, "cuda", torch.float32, requires_grad=True)
    # FlexAttention's default 128 x 128 blocks: with 64 x 64 ones torch 2.11's compiled fp32 kernel has no tile
    # config that divides the block (H200: NoValidChoicesError, 6 of 7 masks), a limit of flex, not of the mask
    out = flex_flashmask_attention(q, k, v, sri, m.causal, 0.25, block_size=128, compile=True)
    ref, _ = flashmask_attention_reference(q, k, v, sri, m.causal, 0.25)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    # tolerance derived from the fp32 reference's own error against float64 on the same inputs (x8, +1e-5)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    r64, _ = flashmask_attention_reference(*leaves, sri, m.causal, 0.25, compute_dtype=torch.float64)
    g64 = torch.autograd.grad(r64, leaves, dout.double())
    for ours, ref32, truth in zip((out, *grads), (ref, *ref_grads), (r64, *g64)):
        tol = 8 * (ref32.double() - truth).abs().max().item() + 1e-5
        assert torch.isfinite(ours).all() and (ours.double() - truth).abs().max().item() <= tol


def test_plain_and_errors():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 20, 2, 8, generator=g) for _ in range(3))
    for causal in (True, False):
        out = flex_flashmask_attention(q, k, v, None, causal, block_size=16)
        assert_matches_reference(out, q, k, v, None, causal, 8 ** -0.5)
    per_head = M.random_eviction_mask(20, num_heads=2).startend_row_indices
    with pytest.raises(ValueError, match="H_mask=2"):
        flashmask_mask_mod(per_head, True)
    with pytest.raises(ValueError, match="H_mask=2"):
        flashmask_block_mask(per_head, True, num_heads=3)


@pytest.mark.parametrize("s", [1, 127, 128, 129])
def test_default_block_size_edges(s):
    m = M.causal_document_mask([[max(1, s // 3), s - max(1, s // 3)] if s > 1 else [1]])
    ours = flashmask_block_mask(m.startend_row_indices, m.causal)  # BLOCK_SIZE 128
    ref = create_block_mask(flashmask_mask_mod(m.startend_row_indices, m.causal), 1, 1, s, s, device="cpu")
    for attr in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices"):
        assert torch.equal(getattr(ours, attr), getattr(ref, attr)), attr
    g = torch.Generator().manual_seed(s)
    q, k, v = (torch.randn(1, s, 2, 8, generator=g) for _ in range(3))
    out = flex_flashmask_attention(q, k, v, None, True, block_mask=ours)
    assert_matches_reference(out, q, k, v, m.startend_row_indices, True, 8 ** -0.5)


def test_block_mask_cache():
    from flashmask import flex

    sri = M.causal_document_mask([10, 10]).startend_row_indices.clone()
    a = flex._block_mask_for(sri, True, 2, 16, 20)
    assert flex._block_mask_for(sri, True, 2, 16, 20) is a  # same tensor, unchanged: reused
    assert flex._block_mask_for(sri, True, 2, 8, 20) is not a  # other block size
    b = flex._block_mask_for(sri, True, 2, 16, 20)
    sri[0, 0, :10, 0] = 20  # in-place edit bumps the version: rebuilt, and the new mask is used
    c = flex._block_mask_for(sri, True, 2, 16, 20)
    assert c is not b and torch.equal(c.kv_num_blocks, flashmask_block_mask(sri, True, 2, 16).kv_num_blocks)
    assert flex._block_mask_for(sri.clone(), True, 2, 16, 20) is not c  # another tensor object


def test_block_mask_cache_under_torch_compile():
    """The flex backend inside a compiled function (as in compiled decoder layers): each call follows its own
    mask. A traced BlockMask cache would make dynamo keep the first call's BlockMask as a graph constant, so every
    later mask would run with it (wrong output, no error): the builder runs eagerly (compiler.disable)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    s = 64
    q, k, v = (torch.randn(1, s, 2, 16, generator=g) for _ in range(3))
    fn = torch.compile(lambda q, k, v, sri: flex_flashmask_attention(q, k, v, sri, True, block_size=16,
                                                                     compile=False))
    for lens in ([s], [16, 48], [8] * 8):
        sri = M.causal_document_mask([lens]).startend_row_indices
        assert_matches_reference(fn(q, k, v, sri), q, k, v, sri, True, 16 ** -0.5)
