"""flashmask_attention argument validation and dispatch (flashmask.api).

Every malformed argument must raise ValueError whose message gives the expected and the actual value.
"""

import pytest
import torch

from flashmask import flashmask_attention
from flashmask import masks as M
from flashmask.api import sliding_window_startend
from flashmask.reference import flashmask_attention_reference


def qkv(b=2, s=8, h_q=4, h_k=2, d=8, dtype=torch.float32, s_k=None):
    g = torch.Generator().manual_seed(0)
    s_k = s if s_k is None else s_k
    return (torch.randn(b, s, h_q, d, generator=g).to(dtype), torch.randn(b, s_k, h_k, d, generator=g).to(dtype),
            torch.randn(b, s_k, h_k, d, generator=g).to(dtype))


def sri_of(b=2, h=1, s=8, c=1, fill=8, dtype=torch.int32):
    return torch.full((b, h, s, c), fill, dtype=dtype)


def raises(*fragments, **call):
    """Call flashmask_attention(**call) and check the ValueError text contains every fragment."""
    with pytest.raises(ValueError) as e:
        flashmask_attention(*call.pop("args"), **call)
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))


def test_rank_dtype_and_shape_of_qkv():
    q, k, v = qkv()
    raises("[batch, seq, heads, head_dim]", "[2, 8, 32]", args=(q.flatten(2), k, v))
    raises("float16, bfloat16 or float32", "torch.int64", args=(q.long(), k, v))
    raises("share a dtype", "torch.float32", "torch.float16", args=(q, k.half(), v.half()))
    raises("key and value shapes differ", "[2, 8, 2, 8]", "[2, 9, 2, 8]", args=(q, k, torch.randn(2, 9, 2, 8)),
           causal=False)
    raises("batch=2", "head_dim=8", "[2, 8, 2, 4]", args=(q, k[..., :4], v[..., :4]))
    raises("multiple of key/value heads", "(4)", "(3)", args=(q, torch.randn(2, 8, 3, 8), torch.randn(2, 8, 3, 8)))
    raises("must be a torch.Tensor", "list", args=(q, [1], v))


def test_device_mismatch():
    q, k, v = qkv()
    raises("one device", "cpu", "meta", args=(q, k.to("meta"), v.to("meta")))
    raises("startend_row_indices is on meta", "query on cpu", args=(q, k, v, sri_of().to("meta")))


def test_causal_needs_square():
    q, k, v = qkv(s=8, s_k=12)
    raises("seq_q == seq_k", "seq_q=8", "seq_k=12", ".transpose(1, 2)", args=(q, k, v))
    out = flashmask_attention(q, k, v, causal=False)  # non-causal cross lengths are fine
    assert out.shape == q.shape


def test_startend_rank_dtype_shape():
    q, k, v = qkv()
    raises("4-D tensor", "[2, 1, 8]", args=(q, k, v, sri_of()[..., 0]))
    raises("4-D tensor", "list", args=(q, k, v, [[8]]))
    raises("must be int32", "torch.int64", ".to(torch.int32)", args=(q, k, v, sri_of(dtype=torch.int64)))
    raises("batch=2", "seq_k=8", "[1, 1, 8, 1]", args=(q, k, v, sri_of(b=1)))
    raises("batch=2", "seq_k=8", "[2, 1, 7, 1]", args=(q, k, v, sri_of(s=7)))
    raises("heads_mask must be 1 or heads_k=2", "got 4", "per-query-head", args=(q, k, v, sri_of(h=4)))


@pytest.mark.parametrize("causal,bad_c", [(True, 4), (True, 3), (False, 1), (False, 3)])
def test_c_versus_causal(causal, bad_c):
    q, k, v = qkv()
    allowed = "(1, 2)" if causal else "(2, 4)"
    raises(allowed, f"causal={causal}", f"got {bad_c}", args=(q, k, v, sri_of(c=bad_c)), causal=causal)


def test_index_range():
    q, k, v = qkv()
    raises("[0, seq_q=8]", "max 9", args=(q, k, v, sri_of(fill=9)))
    raises("[0, seq_q=8]", "min -1", args=(q, k, v, sri_of(fill=-1)))
    flashmask_attention(q, k, v, sri_of(fill=8))  # S_q itself is allowed (empty interval)


def test_dropout_window_and_impl():
    q, k, v = qkv()
    raises("dropout must be 0.0", "0.1", args=(q, k, v), dropout=0.1)
    raises("window_size and startend_row_indices cannot be combined", args=(q, k, v, sri_of()), window_size=2)
    raises("non-negative", "-1", args=(q, k, v), window_size=-1)
    raises("window_size=w or (w, 0)", "(2, 1)", args=(q, k, v), window_size=(2, 1))
    raises("impl must be one of", "'auto', 'triton', 'reference'", "'cuda'", args=(q, k, v), impl="cuda")


@pytest.mark.parametrize("causal,window", [(True, 0), (True, 2), (True, (3, 0)), (True, 20), (False, 2),
                                           (False, (1, 3)), (False, (0, 0))])
def test_window_size_equals_builder(causal, window):
    q, k, v = qkv(s=11)
    m = M.sliding_window_mask(11, window, causal=causal, batch_size=2)
    assert torch.equal(sliding_window_startend(window, 11, causal, 2, "cpu"), m.startend_row_indices)
    a = flashmask_attention(q, k, v, window_size=window, causal=causal)
    b = flashmask_attention(q, k, v, m.startend_row_indices, causal=m.causal)
    assert torch.equal(a, b)


def test_dispatch_and_outputs():
    q, k, v = qkv(dtype=torch.float16)
    m = M.causal_document_mask([[3, 5], [8]])
    out, lse = flashmask_attention(q, k, v, m.startend_row_indices, causal=True, return_softmax_lse=True,
                                   softmax_scale=0.25, impl="auto")  # auto = reference on CPU
    ref_out, ref_lse = flashmask_attention_reference(q, k, v, m.startend_row_indices, True, 0.25)
    assert out.dtype == torch.float16 and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 8)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    plain = flashmask_attention(q, k, v, impl="reference")  # None = plain causal
    assert torch.equal(plain, flashmask_attention(q, k, v, M.causal_mask(8, 2).startend_row_indices))
    default_scale = flashmask_attention(q, k, v, m.startend_row_indices)
    assert torch.equal(default_scale, flashmask_attention(q, k, v, m.startend_row_indices, softmax_scale=8 ** -0.5))


def test_bidirectional_window_cross_lengths():
    q, k, v = qkv(s=4, s_k=8)
    out = flashmask_attention(q, k, v, causal=False, window_size=(1, 1))
    i, j = torch.arange(4)[:, None], torch.arange(8)[None, :]
    allowed = (j >= i - 1) & (j <= i + 1)  # query i sees keys [i-1, i+1]
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(q.shape[2] // k.shape[2], 2).transpose(1, 2),
        v.repeat_interleave(q.shape[2] // k.shape[2], 2).transpose(1, 2), attn_mask=allowed).transpose(1, 2)
    torch.testing.assert_close(out, expected)


def test_window_with_non_tensor_query_is_value_error():
    _, k, v = qkv()
    with pytest.raises(ValueError, match="query must be a torch.Tensor"):
        flashmask_attention([1], k, v, window_size=2)


def test_index_range_check_is_cached_and_sees_inplace_edits():
    """The [0, S_q] range check reads min/max once per index tensor (one host sync per batch, not per layer),
    yet an in-place edit of the tensor is re-checked."""
    q, k, v = qkv()
    sri = M.causal_document_mask([[3, 5], [8]], seq_len=8).startend_row_indices
    flashmask_attention(q, k, v, sri)
    assert sri._flashmask_range[1:] == (3, 8)
    sri[0, 0, 0, 0] = 9  # out of range, written in place
    with pytest.raises(ValueError, match=r"\[0, seq_q=8\].*max 9"):
        flashmask_attention(q, k, v, sri)
