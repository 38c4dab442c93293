"""Chunked log-probs equal the full fp32 log-softmax, in value and gradient, without saving [T, V]."""

import pytest
import torch

from paddlenlp_ext.trl.logprobs import (
    pair_logps_from_hidden,
    pair_logps_from_logits,
    response_segments,
    token_logps,
    token_logps_from_logits,
)


def _naive(hidden, weight, targets):
    return (hidden @ weight.T).float().log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_token_logps_value_and_grad(chunk):
    g = torch.Generator().manual_seed(0)
    T, H, V = 23, 16, 50
    h = torch.randn(T, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, V, (T,), generator=g)
    got = token_logps(h, w, t, chunk_size=chunk)
    want = _naive(h, w, t)
    # fp32 softmax in both; same dtype path -> exact to fp32 rounding of identical ops
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    gh, gw = torch.autograd.grad(got.sum() * 1.3, (h, w))
    eh, ew = torch.autograd.grad(want.sum() * 1.3, (h, w))
    torch.testing.assert_close(gh, eh, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gw, ew, rtol=1e-6, atol=1e-6)


def test_token_logps_does_not_save_full_logits():
    T, H, V, chunk = 256, 8, 1000, 32
    h = torch.randn(T, H, requires_grad=True)
    w = torch.randn(V, H, requires_grad=True)
    t = torch.randint(0, V, (T,))
    saved = {}

    def pack(x):  # unique storages only: the weight is saved once per chunk but never copied
        saved[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = token_logps(h, w, t, chunk_size=chunk)
    full = T * V * 4
    # Only inputs (hidden, weight, targets) are kept: no [T, V] or [chunk, V] fp32 logits.
    assert sum(saved.values()) <= (T * H + V * H) * 4 + T * 8
    assert sum(saved.values()) < full / 10
    out.sum().backward()
    assert h.grad is not None and w.grad is not None


def test_token_logps_from_logits_matches():
    x = torch.randn(9, 30, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 30, (9,))
    got = token_logps_from_logits(x, t, chunk_size=4)
    want = x.float().log_softmax(-1).gather(-1, t[:, None]).squeeze(-1)
    torch.testing.assert_close(got, want)
    (g1,) = torch.autograd.grad(got.sum(), x)
    (g2,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(g1, g2)


def test_target_range_error():
    with pytest.raises(ValueError, match=r"target ids must be in \[0, 5\)"):
        token_logps(torch.randn(2, 3), torch.randn(5, 3), torch.tensor([0, 5]))


def _pack():
    # Spec 2.6 worked example 1 with our semantics, plus example 2, packed in one row of L=16.
    #  0   1  2  3  4  5  6   7  8 |  9  10 11 12 13 14 | 15
    # <s> P1 P2 C1 C2 C3 P2' R1 R2 | <s> Q  Y  Q  N1 N2 | pad
    E = 99
    cl = [-100] * 16
    rl = [-100] * 16
    cl[2:6] = [13, 14, 15, E]        # chosen targets C1 C2 C3 </s> at positions 2..5
    rl[6:9] = [21, 22, E]            # rejected targets R1 R2 </s> at positions 6..8
    cl[10:12] = [31, E]              # pair 2: chosen Y </s>
    rl[12:15] = [41, 42, E]          # rejected N1 N2 </s>
    return {
        "chosen_labels": torch.tensor([cl]),
        "rejected_labels": torch.tensor([rl]),
        "response_indexs": torch.tensor([[0, 2, 6, 9], [0, 10, 12, 15]]),
    }


def test_pair_logps_sum_each_response_own_tokens():
    batch = _pack()
    V, H = 100, 8
    hidden = torch.randn(1, 16, H, dtype=torch.float64)
    w = torch.randn(V, H, dtype=torch.float64)
    lp = (hidden[0] @ w.T).float().log_softmax(-1)  # [16, V]
    out = pair_logps_from_hidden(hidden, w, batch, chunk_size=3)
    want_c = [lp[2, 13] + lp[3, 14] + lp[4, 15] + lp[5, 99], lp[10, 31] + lp[11, 99]]
    want_r = [lp[6, 21] + lp[7, 22] + lp[8, 99], lp[12, 41] + lp[13, 42] + lp[14, 99]]
    torch.testing.assert_close(out.chosen, torch.stack(want_c))
    torch.testing.assert_close(out.rejected, torch.stack(want_r))
    assert out.chosen_tokens.tolist() == [4, 2] and out.rejected_tokens.tolist() == [3, 3]
    out2 = pair_logps_from_logits((hidden @ w.T), batch, chunk_size=5)
    torch.testing.assert_close(out2.chosen, out.chosen)
    torch.testing.assert_close(out2.rejected, out.rejected)


def test_pair_logps_errors():
    batch = _pack()
    bad = dict(batch, response_indexs=torch.tensor([[0, 2, 6, 9], [0, 10, 12, 17]]))
    with pytest.raises(ValueError, match="row 1"):
        pair_logps_from_logits(torch.randn(1, 16, 100), bad)
    bad = dict(batch, response_indexs=torch.tensor([[0, 2, 7, 9], [0, 10, 12, 15]]))
    with pytest.raises(ValueError, match="outside"):
        pair_logps_from_logits(torch.randn(1, 16, 100), bad)
    seg = response_segments(batch["response_indexs"], 1, 16)
    assert seg[0].tolist() == [-1, -1, 0, 0, 0, 0, 1, 1, 1, -1, 2, 2, 3, 3, 3, -1]
