"""Mask builders, golden cases, from_dense and tile classification (flashmask.masks).

Every builder is checked against a dense mask written directly from the concept with Python loops (never via
``to_dense``); golden vectors/matrices are FlashMask brief §1.5 (Paddle docstring N=10, worked cases E1-E16,
PaddleNLP write-up 16x16 tile example).
"""

import random

import pytest
import torch

from flashmask import masks as M
from flashmask.dense import to_dense


# ------------------------------------------------------------------ dense oracles (loops, from the concept)

def dense(s_q, s_k, allow):
    """bool [S_q, S_k] with allow(i, j) evaluated per element."""
    return torch.tensor([[bool(allow(i, j)) for j in range(s_k)] for i in range(s_q)])


def doc_of(lengths):
    """Per token: (doc index, start, end); tokens past the documents map to None."""
    out, pos = [], 0
    for d, n in enumerate(lengths):
        out += [(d, pos, pos + n)] * n
        pos += n
    return out


def o_causal_doc(lengths, s):
    doc = doc_of(lengths)
    return dense(s, s, lambda i, j: i < len(doc) and j < len(doc) and doc[i][0] == doc[j][0] and j <= i)


def o_doc(lengths, s):
    doc = doc_of(lengths)
    return dense(s, s, lambda i, j: i < len(doc) and j < len(doc) and doc[i][0] == doc[j][0])


def o_share_question(samples, s):
    # token -> (sample id, part id) where part 0 = question, a >= 1 = answer a
    tok = []
    for k, (p, answers) in enumerate(samples):
        tok += [(k, 0)] * p
        for a, n in enumerate(answers, start=1):
            tok += [(k, a)] * n
    n = len(tok)

    def allow(i, j):
        if i >= n or j >= n or j > i or tok[i][0] != tok[j][0]:
            return False
        return tok[j][1] == 0 or tok[j][1] == tok[i][1]

    return dense(s, s, allow)


def o_blockwise(lengths, s):
    doc = doc_of(lengths)
    n = len(doc)
    s_last = sum(lengths) - [x for x in lengths if x > 0][-1]

    def allow(i, j):
        if j > i or j >= n:
            return False
        if i >= n:  # documented limitation: padding rows still see the documents before the last one
            return j < s_last
        return doc[i][0] == doc[j][0] or doc[i][0] == doc[n - 1][0]  # the last document sees all

    return dense(s, s, allow)


def o_block_causal(lengths, s):
    doc = doc_of(lengths)
    return dense(s, s, lambda i, j: i < len(doc) and j < len(doc) and doc[j][0] <= doc[i][0])


def o_prefix_doc(lengths, prefixes, s):
    doc = doc_of(lengths)
    pre = [p for p, n in zip(prefixes, lengths) for _ in range(n)]

    def allow(i, j):
        if i >= len(doc) or j >= len(doc) or doc[i][0] != doc[j][0]:
            return False
        return j <= i or j < doc[j][1] + pre[j]

    return dense(s, s, allow)


def rand_lengths(rng, s, pad):
    total = s - (rng.randint(1, 3) if pad else 0)
    out = []
    while sum(out) < total:
        out.append(min(rng.randint(1, 6), total - sum(out)))
    return out


def check(m, expected, causal, c=None):
    """m: FlashMask; expected: bool [B, S_q, S_k] or [S_q, S_k] (broadcast over batch)."""
    sri = m.startend_row_indices
    assert sri.dtype == torch.int32 and sri.dim() == 4 and m.causal is causal
    if c is not None:
        assert sri.shape[-1] == c
    got = to_dense(sri, m.causal)
    exp = expected if expected.dim() == 3 else expected.expand(sri.shape[0], *expected.shape)
    assert torch.equal(got[:, 0], exp), (got[:, 0].int(), exp.int())


# ------------------------------------------------------------------ builders vs oracles

@pytest.mark.parametrize("s", [1, 7, 16])
def test_simple_builders(s):
    check(M.causal_mask(s, batch_size=2), dense(s, s, lambda i, j: j <= i), True, 1)
    check(M.full_mask(s), dense(s, s, lambda i, j: True), False, 2)
    wide = M.full_mask(s, seq_q=s + 3).dense(s + 3)  # S_q != S_k
    assert wide.shape == (1, 1, s + 3, s) and bool(wide.all())
    for w in [0, 1, 3]:
        check(M.sliding_window_mask(s, w), dense(s, s, lambda i, j: i - w <= j <= i), True, 1)
        for sink in [0, 2]:
            check(M.sliding_window_mask(s, w, sink_tokens=min(sink, s)),
                  dense(s, s, lambda i, j: j <= i and (i - w <= j or j < sink)), True, 1)
    for wl, wr in [(0, 0), (1, 2), (3, 0)]:
        check(M.sliding_window_mask(s, (wl, wr), causal=False), dense(s, s, lambda i, j: i - wl <= j <= i + wr),
              False, 2)
    for g, (wl, wr) in [(1, (1, 1)), (2, (0, 2)), (0, (2, 1))]:
        check(M.global_sliding_window_mask(s, min(g, s), (wl, wr)),
              dense(s, s, lambda i, j: i < g or j < g or i - wl <= j <= i + wr), False, 4)
    for p in [0, 1, s]:
        check(M.prefix_lm_causal_mask(s, p), dense(s, s, lambda i, j: j <= i or j < p), False, 2)
    check(M.key_padding_mask([s, s // 2], s), torch.stack([dense(s, s, lambda i, j, n=n: j < n) for n in (s, s // 2)]),
          False, 2)
    check(M.key_padding_mask([s // 2], s, causal=True), dense(s, s, lambda i, j: j < s // 2 and j <= i), True, 1)
    check(M.query_padding_mask([s - 1, s], s), torch.stack([dense(s, s, lambda i, j, n=n: i < n and j <= i)
                                                          for n in (s - 1, s)]), True, 1)
    check(M.query_padding_mask([s // 2], s, causal=False), dense(s, s, lambda i, j: i < s // 2), False, 2)


@pytest.mark.parametrize("seed", range(6))
def test_document_builders(seed):
    rng = random.Random(seed)
    s = rng.choice([5, 12, 23])
    rows = [rand_lengths(rng, s, pad=(b == 1 and seed % 2 == 0)) for b in range(2)]
    check(M.causal_document_mask(rows, seq_len=s), torch.stack([o_causal_doc(r, s) for r in rows]), True, 1)
    cu = [[0] + torch.tensor(r).cumsum(0).tolist() for r in rows]
    check(M.causal_document_mask(cu_seqlens=cu, seq_len=s), torch.stack([o_causal_doc(r, s) for r in rows]), True, 1)
    check(M.document_mask(rows, seq_len=s), torch.stack([o_doc(r, s) for r in rows]), False, 2)
    check(M.causal_blockwise_mask(rows, seq_len=s), torch.stack([o_blockwise(r, s) for r in rows]), True, 2)
    check(M.block_causal_mask(rows, seq_len=s), torch.stack([o_block_causal(r, s) for r in rows]), False, 2)
    prefixes = [[rng.randint(0, n) for n in r] for r in rows]
    check(M.prefix_lm_document_mask(rows, prefixes, seq_len=s),
          torch.stack([o_prefix_doc(r, p, s) for r, p in zip(rows, prefixes)]), False, 2)


def test_padding_rows_are_empty():
    m = M.causal_document_mask([3, 2], seq_len=8)
    d = m.dense()[0, 0]
    assert m.startend_row_indices[0, 0, 5:, 0].tolist() == [0, 0, 0]  # collator layout: padding columns hold 0
    assert not d[5:].any() and not d[:, 5:].any()


@pytest.mark.parametrize("seed", range(4))
def test_share_question(seed):
    rng = random.Random(seed)
    rows = [[(rng.randint(1, 4), [rng.randint(1, 3) for _ in range(rng.randint(1, 3))])
             for _ in range(rng.randint(1, 3))] for _ in range(2)]
    s = max(sum(p + sum(a) for p, a in r) for r in rows) + seed % 2
    check(M.share_question_mask(rows, seq_len=s), torch.stack([o_share_question(r, s) for r in rows]), True, 1)


def test_qk_sparse():
    s, ranges = 12, [(0, 2), (3, 6), (8, 11)]
    inside = lambda i, j: any(a <= i < b and a <= j < b for a, b in ranges)  # noqa: E731
    check(M.qk_sparse_mask(s, ranges), dense(s, s, lambda i, j: j <= i and not inside(i, j)), True, 2)
    with pytest.raises(ValueError, match="overlap"):
        M.qk_sparse_mask(s, [(0, 4), (3, 5)])


def test_random_eviction():
    m = M.random_eviction_mask(16, evict_prob=0.5, num_heads=3, batch_size=2, seed=7)
    sri = m.startend_row_indices
    assert sri.shape == (2, 3, 16, 1) and m.causal
    assert torch.equal(sri, M.random_eviction_mask(16, 0.5, 3, 2, seed=7).startend_row_indices)
    assert not torch.equal(sri, M.random_eviction_mask(16, 0.5, 3, 2, seed=8).startend_row_indices)
    r = sri[..., 0].long()
    j = torch.arange(16)
    assert bool(((r > j) & (r <= 16)).all()) and bool((r < 16).any())
    for b in range(2):
        for h in range(3):
            rb = r[b, h].tolist()
            exp = dense(16, 16, lambda i, jj: jj <= i and i < rb[jj])  # key j dropped from row r_j on
            assert torch.equal(m.dense()[b, h], exp)
    assert (M.random_eviction_mask(16, 0.0).startend_row_indices == 16).all()


def test_builder_errors():
    with pytest.raises(ValueError, match="seq_len=5"):
        M.causal_document_mask([3, 3], seq_len=5)
    with pytest.raises(ValueError, match="exactly one"):
        M.causal_document_mask([3], cu_seqlens=[0, 3])
    with pytest.raises(ValueError, match="cu_seqlens"):
        M.causal_document_mask(cu_seqlens=[1, 3])
    with pytest.raises(ValueError, match="window_size"):
        M.sliding_window_mask(8, (2, 1), causal=True)
    with pytest.raises(ValueError, match="prefix_lengths"):
        M.prefix_lm_document_mask([3, 3], [1])
    with pytest.raises(ValueError, match="non-negative ints"):  # a float length: ValueError, not TypeError
        M.causal_document_mask([3.5, 2])
    with pytest.raises(ValueError, match=r"\(prompt_len, \[answer_len"):  # flat list instead of samples
        M.share_question_mask([[3, 2, 2]])


def test_to_dense_accepts_a_flashmask():
    m = M.share_question_mask([(3, [3, 2])])
    assert torch.equal(to_dense(m), to_dense(m.startend_row_indices, m.causal))
    assert torch.equal(M.to_dense(m, causal=False), m.dense())  # the FlashMask's own causal flag wins


# ------------------------------------------------------------------ golden cases

def rows_to_bool(text):
    return torch.tensor([[c == "1" for c in row] for row in text.split()])


E = {  # FlashMask brief §1.5b, N = 8: (causal, vectors, allowed rows q0..q7)
    "E1": (False, {'LTS': [8, 8, 8, 8, 8, 8, 8, 8], 'UTE': [0, 0, 0, 0, 0, 0, 0, 0]}, "11111111 11111111 11111111 11111111 11111111 11111111 11111111 11111111"),  # noqa: E501
    "E2": (True, {'LTS': [8, 8, 8, 8, 8, 8, 8, 8]}, "10000000 11000000 11100000 11110000 11111000 11111100 11111110 11111111"),  # noqa: E501
    "E3": (True, {'LTS': [3, 4, 5, 6, 7, 8, 8, 8]}, "10000000 11000000 11100000 01110000 00111000 00011100 00001110 00000111"),  # noqa: E501
    "E4": (True, {'LTS': [3, 3, 3, 6, 6, 6, 8, 8]}, "10000000 11000000 11100000 00010000 00011000 00011100 00000010 00000011"),  # noqa: E501
    "E5": (False, {'LTS': [3, 3, 3, 6, 6, 6, 8, 8], 'UTE': [0, 0, 0, 3, 3, 3, 6, 6]}, "11100000 11100000 11100000 00011100 00011100 00011100 00000011 00000011"),  # noqa: E501
    "E6": (True, {'LTS': [8, 8, 8, 6, 6, 6, 8, 8]}, "10000000 11000000 11100000 11110000 11111000 11111100 11100010 11100011"),  # noqa: E501
    "E7": (False, {'LTS': [8, 3, 4, 5, 6, 7, 8, 8], 'LTE': [8, 8, 8, 8, 8, 8, 8, 8], 'UTS': [0, 0, 0, 1, 1, 1, 1, 1], 'UTE': [0, 0, 0, 2, 3, 4, 5, 6]}, "11111111 11100000 11110000 10111000 10011100 10001110 10000111 10000011"),  # noqa: E501
    "E8": (False, {'LTS': [8, 8, 8, 8, 8, 8, 8, 8], 'UTE': [0, 0, 0, 3, 4, 5, 6, 7]}, "11100000 11100000 11100000 11110000 11111000 11111100 11111110 11111111"),  # noqa: E501
    "E9": (False, {'LTS': [4, 4, 4, 4, 8, 8, 8, 8], 'UTE': [0, 0, 2, 3, 4, 5, 6, 7]}, "11000000 11000000 11100000 11110000 00001000 00001100 00001110 00001111"),  # noqa: E501
    "E10": (True, {'LTS': [3, 3, 3, 6, 6, 6, 8, 8], 'LTE': [6, 6, 6, 6, 6, 6, 8, 8]}, "10000000 11000000 11100000 00010000 00011000 00011100 11111110 11111111"),  # noqa: E501
    "E11": (True, {'LTS': [8, 8, 2, 3, 4, 8, 8, 8], 'LTE': [8, 8, 5, 5, 5, 8, 8, 8]}, "10000000 11000000 11000000 11000000 11000000 11111100 11111110 11111111"),  # noqa: E501
    "E12": (True, {'LTS': [5, 8, 4, 8, 7, 8, 8, 8]}, "10000000 11000000 11100000 11110000 11011000 01011100 01011110 01010111"),  # noqa: E501
    "E13": (False, {'LTS': [8, 8, 8, 8, 8, 8, 0, 0], 'UTE': [0, 0, 0, 0, 0, 0, 0, 0]}, "11111100 11111100 11111100 11111100 11111100 11111100 11111100 11111100"),  # noqa: E501
    "E14": (True, {'LTS': [6, 6, 6, 6, 6, 6, 6, 6]}, "10000000 11000000 11100000 11110000 11111000 11111100 00000000 00000000"),  # noqa: E501
    "E15": (False, {'LTS': [8, 8, 8, 8, 8, 8, 8, 8], 'UTE': [0, 0, 0, 3, 3, 3, 6, 6]}, "11100000 11100000 11100000 11111100 11111100 11111100 11111111 11111111"),  # noqa: E501
    "E16": (True, {'LTS': [8, 4, 5, 6, 7, 8, 8, 8]}, "10000000 11000000 11100000 11110000 10111000 10011100 10001110 10000111"),  # noqa: E501
}

E_BUILDERS = {
    "E1": lambda: M.full_mask(8), "E2": lambda: M.causal_mask(8), "E3": lambda: M.sliding_window_mask(8, 2),
    "E4": lambda: M.causal_document_mask([3, 3, 2]), "E5": lambda: M.document_mask([3, 3, 2]),
    "E6": lambda: M.share_question_mask([(3, [3, 2])]), "E7": lambda: M.global_sliding_window_mask(8, 1, (1, 1)),
    "E8": lambda: M.prefix_lm_causal_mask(8, 3), "E9": lambda: M.prefix_lm_document_mask([4, 4], [2, 1]),
    "E10": lambda: M.causal_blockwise_mask([3, 3, 2]), "E11": lambda: M.qk_sparse_mask(8, [(2, 5)]),
    "E12": None, "E13": lambda: M.key_padding_mask([6], 8), "E14": lambda: M.query_padding_mask([6], 8),
    "E15": lambda: M.block_causal_mask([3, 3, 2]), "E16": lambda: M.sliding_window_mask(8, 2, sink_tokens=1),
}


def vec_tensor(causal, vecs):
    keys = {True: {1: ["LTS"], 2: ["LTS", "LTE"]}, False: {2: ["LTS", "UTE"], 4: ["LTS", "LTE", "UTS", "UTE"]}}
    order = keys[causal][len(vecs)]
    return torch.tensor([vecs[k] for k in order], dtype=torch.int32).T[None, None]  # [1, 1, S, C]


@pytest.mark.parametrize("name", list(E))
def test_golden_n8(name):
    causal, vecs, rows = E[name]
    sri, exp = vec_tensor(causal, vecs), rows_to_bool(rows)
    assert torch.equal(to_dense(sri, causal)[0, 0], exp)
    if E_BUILDERS[name] is not None:
        m = E_BUILDERS[name]()
        assert m.causal is causal and torch.equal(m.startend_row_indices, sri)
        assert torch.equal(m.dense()[0, 0], exp)
    back = M.from_dense(exp[None, None], causal)  # converter reproduces the mask, never with more vectors
    assert torch.equal(back.dense()[0, 0], exp) and back.startend_row_indices.shape[-1] <= sri.shape[-1]


N = 10
PADDLE = [  # Paddle flashmask_attention docstring, N = 10: (causal, vectors, builder, oracle allow(i, j))
    (True, {"LTS": [4, 4, 4, 4, 7, 7, 7, 10, 10, 10]}, lambda: M.causal_document_mask([4, 3, 3]),
     lambda i, j: j <= i and (i < 4) == (j < 4) and (i < 7) == (j < 7)),
    (True, {"LTS": [3, 4, 5, 6, 7, 8, 9, 10, 10, 10]}, lambda: M.sliding_window_mask(10, 2),
     lambda i, j: i - 2 <= j <= i),
    (False, {"LTS": [4, 4, 4, 4, 7, 7, 7, 10, 10, 10], "UTE": [0, 0, 0, 0, 4, 4, 4, 7, 7, 7]},
     lambda: M.document_mask([4, 3, 3]), lambda i, j: (i < 4) == (j < 4) and (i < 7) == (j < 7)),
    (True, {"LTS": [10, 10, 10, 10, 7, 7, 7, 10, 10, 10]}, lambda: M.share_question_mask([(4, [3, 3])]),
     lambda i, j: j <= i and (j < 4 or (i < 7) == (j < 7))),
    (False, {"LTS": [10, 10, 4, 5, 6, 7, 8, 9, 10, 10], "LTE": [10] * 10, "UTS": [0, 0, 0, 0, 2, 2, 2, 2, 2, 2],
             "UTE": [0, 0, 0, 0, 3, 4, 5, 6, 7, 8]}, lambda: M.global_sliding_window_mask(10, 2, (1, 1)),
     lambda i, j: i < 2 or j < 2 or abs(i - j) <= 1),
    (True, {"LTS": [4, 4, 4, 4] + [10] * 6, "LTE": [7, 7, 7, 7] + [10] * 6},
     lambda: M.causal_blockwise_mask([4, 3, 3]),
     lambda i, j: j <= i and ((i < 4) == (j < 4) and (i < 7) == (j < 7) or i >= 7 or (4 <= i and 4 <= j))),
    (False, {"LTS": [3, 3, 3, 5, 5, 10, 10, 10, 10, 10], "UTE": [0, 0, 2, 3, 3, 5, 5, 7, 8, 9]},
     lambda: M.prefix_lm_document_mask([3, 2, 5], [2, 2, 2]), None),
    (False, {"LTS": [10] * 10, "UTE": [0, 0, 0, 0, 0, 5, 6, 7, 8, 9]}, lambda: M.prefix_lm_causal_mask(10, 5),
     lambda i, j: j <= i or j < 5),
    (True, {"LTS": [10, 10, 2, 3, 4, 5, 6, 7, 10, 10], "LTE": [10, 10, 5, 5, 5, 5, 8, 8, 10, 10]},
     lambda: M.qk_sparse_mask(10, [(2, 5), (6, 8)]),
     lambda i, j: j <= i and not (2 <= i < 5 and 2 <= j < 5) and not (6 <= i < 8 and 6 <= j < 8)),
    (True, {"LTS": [8] * 10}, lambda: M.query_padding_mask([8], 10), lambda i, j: j <= i and i < 8),
]


@pytest.mark.parametrize("k", range(len(PADDLE)))
def test_golden_paddle_n10(k):
    causal, vecs, builder, allow = PADDLE[k]
    exp = o_prefix_doc([3, 2, 5], [2, 2, 2], N) if allow is None else dense(N, N, allow)
    assert torch.equal(to_dense(vec_tensor(causal, vecs), causal)[0, 0], exp)
    m = builder()
    assert m.causal is causal and torch.equal(m.dense()[0, 0], exp)


# ------------------------------------------------------------------ from_dense

def random_sri(gen, b, h, s, causal, c):
    """Random valid vectors of one mode (values in [0, S]), LTS <= LTE and UTS <= UTE kept."""
    def r(lo, hi):
        return lo + (torch.rand(b, h, s, generator=gen) * (hi - lo + 1)).long().clamp(max=hi - lo)
    j = torch.arange(s)
    lts = r(torch.zeros(s, dtype=torch.long), torch.full((s,), s))
    if causal:
        lts = torch.maximum(lts, j)  # typical causal masks start at or below the diagonal
    lte = lts + r(torch.zeros(s, dtype=torch.long), s - lts)
    ute = r(torch.zeros(s, dtype=torch.long), torch.full((s,), s))
    uts = (torch.rand(b, h, s, generator=gen) * (ute + 1)).long().clamp(max=ute)
    vec = {(True, 1): [lts], (True, 2): [lts, lte], (False, 2): [lts, ute], (False, 4): [lts, lte, uts, ute]}
    return torch.stack(vec[(causal, c)], -1).to(torch.int32)


@pytest.mark.parametrize("causal,c", [(True, 1), (True, 2), (False, 2), (False, 4)])
@pytest.mark.parametrize("s", [1, 5, 17])
def test_from_dense_round_trip(causal, c, s):
    gen = torch.Generator().manual_seed(s * 10 + c)
    for _ in range(5):
        sri = random_sri(gen, 2, 3, s, causal, c)
        d = to_dense(sri, causal)
        back = M.from_dense(d, causal)
        assert back.causal is causal and back.startend_row_indices.dtype == torch.int32
        assert back.startend_row_indices.shape[:3] == (2, 3, s)
        assert back.startend_row_indices.shape[-1] <= c
        assert torch.equal(to_dense(back.startend_row_indices, causal), d)


def test_from_dense_is_compact():
    assert M.from_dense(M.causal_document_mask([3, 3, 2]).dense(), True).startend_row_indices.shape[-1] == 1
    assert M.from_dense(M.causal_blockwise_mask([3, 3, 2]).dense(), True).startend_row_indices.shape[-1] == 2
    assert M.from_dense(M.causal_document_mask([3, 3, 2]).dense(), False).startend_row_indices.shape[-1] == 2
    assert M.from_dense(M.global_sliding_window_mask(8, 1, 1).dense(), False).startend_row_indices.shape[-1] == 4
    full = torch.ones(1, 1, 4, 6, dtype=torch.bool)  # S_q != S_k, non-causal
    assert torch.equal(to_dense(M.from_dense(full, False).startend_row_indices, False, seq_q=4), full)


def test_from_dense_errors():
    d = torch.ones(2, 3, 8, 8, dtype=torch.bool)
    d[1, 2, [1, 3, 5], 4] = False  # three masked intervals in column 4 of batch 1, head 2
    with pytest.raises(ValueError, match=r"column 4 \(batch 1, head 2\) has 3 masked row intervals.*at most 2"):
        M.from_dense(d, False)
    c = M.causal_mask(8).dense().clone()
    c[0, 0, [3, 6], 1] = False  # two intervals below the diagonal
    with pytest.raises(ValueError, match=r"column 1 \(batch 0, head 0\) has 2 masked row intervals.*at most 1"):
        M.from_dense(c, True)
    with pytest.raises(ValueError, match="above the diagonal"):
        M.from_dense(torch.ones(1, 1, 4, 4, dtype=torch.bool), True)
    with pytest.raises(ValueError, match="bool"):
        M.from_dense(torch.ones(1, 1, 4, 4), False)


# ------------------------------------------------------------------ tile classification

def truth_classes(allowed, bm, bn):
    """Exact per-tile class from the dense mask: 0 all masked, 1 mixed, 2 all allowed."""
    b, h, s_q, s_k = allowed.shape
    out = torch.zeros(b, h, -(-s_q // bm), -(-s_k // bn), dtype=torch.int8)
    for r in range(out.shape[2]):
        for c in range(out.shape[3]):
            t = allowed[:, :, r * bm:(r + 1) * bm, c * bn:(c + 1) * bn].flatten(2)
            out[:, :, r, c] = torch.where(t.all(-1), 2, torch.where(t.any(-1), 1, 0)).to(torch.int8)
    return out


def test_classify_blocks_golden_16():
    lts = [13, 5, 5, 5, 6, 6, 9, 9, 9, 12, 12, 12, 16, 16, 16, 16]
    lte = [15, 14, 14, 15, 12, 12, 11, 11, 16, 16, 16, 16, 16, 16, 16, 16]
    sri = torch.tensor([lts, lte], dtype=torch.int32).T[None, None]
    mm = M.block_min_max(sri, True, 4)
    assert mm["LTS_max"][0, 0].tolist() == [13, 9, 12, 16] and mm["LTS_min"][0, 0].tolist() == [5, 6, 9, 16]
    assert mm["LTE_max"][0, 0].tolist() == [15, 12, 16, 16] and mm["LTE_min"][0, 0].tolist() == [14, 11, 16, 16]
    # write-up: rows P C C C / P P C C / P P P C / P U S P with C, S -> 0, P -> 1, U -> 2
    expected = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 2, 0, 1]]
    got = M.classify_blocks(sri, True, 4, 4)
    assert got[0, 0].tolist() == expected
    assert torch.equal(got, truth_classes(to_dense(sri, True), 4, 4))


@pytest.mark.parametrize("causal,c", [(True, 1), (True, 2), (False, 2), (False, 4)])
def test_classify_blocks_conservative(causal, c):
    gen = torch.Generator().manual_seed(c + 7 * causal)
    for s, bm, bn in [(16, 4, 4), (19, 8, 4), (23, 4, 8), (5, 16, 16)]:
        sri = random_sri(gen, 2, 2, s, causal, c)
        cls = M.classify_blocks(sri, causal, bm, bn)
        truth = truth_classes(to_dense(sri, causal), bm, bn)
        assert cls.shape == truth.shape
        assert bool(((cls == 0) <= (truth == 0)).all()), "a skipped tile must be fully masked"
        assert bool(((cls == 2) <= (truth == 2)).all()), "an unmasked tile must be fully allowed"
        assert bool(((truth == 1) <= (cls == 1)).all())


@pytest.mark.parametrize("make", [lambda: M.causal_document_mask([5, 9, 2], seq_len=19),
                                  lambda: M.sliding_window_mask(19, 3), lambda: M.causal_mask(19),
                                  lambda: M.document_mask([5, 9, 2], seq_len=19)])
def test_classify_blocks_exact_on_documents(make):
    m = make()
    assert torch.equal(M.classify_blocks(m.startend_row_indices, m.causal, 4, 4), truth_classes(m.dense(), 4, 4))


# ------------------------------------------------------------------ plotting

def read_png(path):
    """Decode an 8-bit RGB, filter-0 PNG (as written by flashmask.plot.write_png) to rows of (r, g, b)."""
    import struct
    import zlib

    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        assert zlib.crc32(tag + body) & 0xFFFFFFFF == struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
        if tag == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif tag == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = 1 + 3 * w
    return [[tuple(raw[r * stride + 1 + 3 * c: r * stride + 4 + 3 * c]) for c in range(w)] for r in range(h)]


def test_plot_png_backend_pixels(tmp_path):
    from flashmask.plot import _ALLOWED_RGB, plot_mask

    m = M.share_question_mask([(3, [3, 2])])
    path = str(tmp_path / "m.png")
    assert plot_mask(m, path=path, backend="png") == "png"
    px = read_png(path)
    cell = len(px) // 8
    exp = rows_to_bool(E["E6"][2])
    got = torch.tensor([[px[i * cell + 1][j * cell + 1] == _ALLOWED_RGB for j in range(8)] for i in range(8)])
    assert torch.equal(got, exp)


def test_plot_matplotlib_and_cli(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from flashmask.plot import main, plot_mask

    m = M.global_sliding_window_mask(10, 2, (1, 1))
    path = tmp_path / "g.png"
    assert plot_mask(m.startend_row_indices, m.causal, str(path), backend="matplotlib") == "matplotlib"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
    out = tmp_path / "cli.png"
    assert main(["causal_document", "--lengths", "3,3,2", "--out", str(out), "--text"]) == 0
    text = capsys.readouterr().out
    assert "LTS   : 3 3 3 6 6 6 8 8" in text and "q3 00010000" in text and out.exists()
    with pytest.raises(ValueError, match="causal"):
        plot_mask(m.startend_row_indices, None, str(path))


def test_docstring_examples():
    import doctest

    result = doctest.testmod(M, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 15 and result.failed == 0


def test_preference_mask_paddlenlp_example():
    # paddlenlp_spec.md §2.6 worked DPO example: two pairs packed into one row of 16 (one padding token)
    m = M.preference_mask(torch.tensor([[0, 2, 6, 9], [0, 10, 12, 15]]), 1, 16)
    paddle = [9, 9, 6, 6, 6, 6, 9, 9, 9, 15, 12, 12, 15, 15, 15, 15]  # PaddleNLP pads with the last value
    assert m.causal and m.startend_row_indices[0, 0, :15, 0].tolist() == paddle[:15]
    assert m.startend_row_indices[0, 0, 15, 0].item() == 0  # our padding convention (same dense mask)
    pad_paddle = torch.tensor(paddle, dtype=torch.int32)[None, None, :, None]
    assert torch.equal(m.dense(), to_dense(pad_paddle, True))
    allowed_first = rows_to_bool("100000000 110000000 111000000 111100000 111110000 111111000 "
                                 "110000100 110000110 110000111")  # the spec's 9x9 table of pair 1
    assert torch.equal(m.dense()[0, 0, :9, :9], allowed_first)
    same = M.share_question_mask([[(2, [4, 3]), (1, [2, 3])]], seq_len=16)
    assert torch.equal(m.startend_row_indices, same.startend_row_indices)
    with pytest.raises(ValueError, match=r"response_indexs\[1\]"):
        M.preference_mask([[0, 2, 6, 9], [0, 8, 12, 15]], 1, 16)  # overlaps the first pair


@pytest.mark.parametrize("argv,msg", [
    (["causal_document", "--lengths", "3,3", "--seq-len", "5", "--text"], "more than seq_len=5"),
    (["share_question", "--samples", "bad", "--text"], "prompt:answer,answer"),
    (["causal", "--seq-len", "4", "--out", "mask.txt"], "ending in .png"),
    (["causal", "--seq-len", "4", "--out", "/no/such/dir/m.png"], "does not exist"),
])
def test_plot_cli_errors_are_one_line(argv, msg, capsys):
    from flashmask.plot import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err
