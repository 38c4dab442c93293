"""FlashMask mask builders, the dense <-> vector converters and the tile classifier.

Every builder returns a :class:`FlashMask` ``(startend_row_indices, causal)``: int32 ``[B, H_mask, S, C]``
vectors plus the ``causal`` flag they must be passed with::

    m = causal_document_mask([3, 3, 2])
    out = flashmask_attention(q, k, v, m.startend_row_indices, causal=m.causal)

Semantics (FlashMask, Wang et al., ICLR 2025; Paddle ``flashmask_attention``): key column ``j`` is masked for
query rows in ``[LTS_j, LTE_j)`` and ``[UTS_j, UTE_j)``; causal mode also masks rows ``i < j``. The vector
formulas follow the Paddle docstring examples and ``flashmask/tests/generate_startend_row_indices.py``
(PaddlePaddle/flash-attention); see ``ops/flashmask/README.md`` for the table and pictures.

Length arguments (``lengths``, ``cu_seqlens``, ``valid_lengths``) take one row (``[3, 3, 2]``) or one list per
batch row (``[[3, 3, 2], [8]]``). Tokens past the last document of a row are padding: their columns are fully
masked (``LTS = 0``, and ``UTE = S`` in non-causal masks) and (except where noted) their rows attend to nothing,
so their attention output is 0.
"""

from __future__ import annotations

from numbers import Integral, Number
from typing import NamedTuple, Sequence

import torch

from .dense import expand_startend, to_dense

__all__ = [
    "FlashMask", "to_dense", "from_dense", "block_min_max", "classify_blocks",
    "causal_mask", "full_mask", "sliding_window_mask", "causal_document_mask", "document_mask",
    "share_question_mask", "preference_mask", "global_sliding_window_mask", "causal_blockwise_mask",
    "block_causal_mask", "prefix_lm_causal_mask", "prefix_lm_document_mask", "qk_sparse_mask",
    "random_eviction_mask", "key_padding_mask", "query_padding_mask",
]


class FlashMask(NamedTuple):
    """A FlashMask: ``startend_row_indices`` int32 ``[B, H_mask, S_k, C]`` and the ``causal`` flag to use it with."""

    startend_row_indices: torch.Tensor
    causal: bool

    def dense(self, seq_q: int | None = None) -> torch.Tensor:
        """Allowed-attention mask, bool ``[B, H_mask, S_q, S_k]`` (True = may attend); see :func:`to_dense`."""
        return to_dense(self.startend_row_indices, self.causal, seq_q=seq_q)


# ----------------------------------------------------------------------------------------------- helpers

def _err(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _as_rows(lengths, name: str) -> list[list[int]]:
    """Normalise one row (``[3, 3, 2]`` or a 1-D tensor) or a list of rows to ``list[list[int]]``."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    _err(isinstance(lengths, (list, tuple)) and len(lengths) > 0, f"{name} must be a non-empty list, got {lengths!r}")
    if all(isinstance(x, Number) for x in lengths):
        rows = [list(lengths)]
    else:
        _err(all(isinstance(r, (list, tuple, torch.Tensor)) for r in lengths),
             f"{name} must be one row of ints or a list of rows, got {lengths!r}")
        rows = [r.tolist() if isinstance(r, torch.Tensor) else list(r) for r in lengths]
    for b, row in enumerate(rows):
        _err(all(isinstance(x, Integral) and x >= 0 for x in row),
             f"{name}[{b}] must hold non-negative ints, got {row!r}")
    return [[int(x) for x in row] for row in rows]


def _doc_rows(lengths, cu_seqlens, seq_len):
    """Document lengths per row and the padded row length S (sum of the longest row when ``seq_len`` is None)."""
    _err((lengths is None) != (cu_seqlens is None), "pass exactly one of lengths and cu_seqlens")
    if cu_seqlens is not None:
        rows = []
        for b, cu in enumerate(_as_rows(cu_seqlens, "cu_seqlens")):
            _err(cu[0] == 0 and all(x <= y for x, y in zip(cu, cu[1:])),
                 f"cu_seqlens[{b}] must start at 0 and be non-decreasing, got {cu}")
            rows.append([y - x for x, y in zip(cu, cu[1:])])
    else:
        rows = _as_rows(lengths, "lengths")
    totals = [sum(r) for r in rows]
    seq_len = max(totals) if seq_len is None else seq_len
    for b, t in enumerate(totals):
        _err(t <= seq_len, f"documents of row {b} hold {t} tokens, more than seq_len={seq_len}")
    return rows, seq_len


def _doc_cols(row: list[int], seq_len: int):
    """Per column: doc start, doc end (int64 ``[S]``) and a bool ``[S]`` that is False on the padding tail."""
    lens = torch.tensor(row, dtype=torch.long)
    ends = torch.cumsum(lens, 0)
    n = int(ends[-1]) if len(row) else 0
    pad = seq_len - n
    start = torch.cat([torch.repeat_interleave(ends - lens, lens), torch.zeros(pad, dtype=torch.long)])
    end = torch.cat([torch.repeat_interleave(ends, lens), torch.zeros(pad, dtype=torch.long)])
    real = torch.arange(seq_len) < n
    return start, end, real


def _pack(cols: list[list[torch.Tensor]], causal: bool, device) -> FlashMask:
    """Stack per-row lists of C int ``[S]`` vectors into a FlashMask ``[B, 1, S, C]`` int32."""
    sri = torch.stack([torch.stack(c, dim=-1) for c in cols])[:, None].to(torch.int32)
    return FlashMask(sri.to(device) if device is not None else sri, causal)


def _per_row(value, batch: int, name: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    vals = [value] * batch if isinstance(value, Integral) else list(value)
    _err(len(vals) == batch, f"{name} needs one value per batch row ({batch}), got {len(vals)}")
    return vals


def _window(window_size, wr_default: int) -> tuple[int, int]:
    """``(wl, wr)`` from ``w`` (then ``wr = wr_default``) or a pair ``(wl, wr)``."""
    if isinstance(window_size, Integral):
        return int(window_size), wr_default if wr_default >= 0 else int(window_size)
    ok = isinstance(window_size, (list, tuple)) and len(window_size) == 2 and all(
        isinstance(w, Integral) for w in window_size)
    _err(ok, f"window_size must be an int w or a pair (wl, wr) of ints, got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _valid_lengths(valid_lengths, seq_len: int) -> list[int]:
    vals = valid_lengths.tolist() if isinstance(valid_lengths, torch.Tensor) else valid_lengths
    _err(isinstance(vals, (list, tuple)), f"valid_lengths must be a list with one int per batch row, e.g. "
         f"[{valid_lengths!r}], got {valid_lengths!r}")
    for b, n in enumerate(vals):
        _err(isinstance(n, Integral) and 0 <= n <= seq_len,
             f"valid_lengths[{b}] must be an int in [0, seq_len={seq_len}], got {n!r}")
    return [int(n) for n in vals]


# ---------------------------------------------------------------------------------------------- builders

def causal_mask(seq_len: int, batch_size: int = 1, device=None) -> FlashMask:
    """Plain causal attention: ``LTS_j = S`` (C=1, causal). Same as ``startend_row_indices=None, causal=True``.

    >>> causal_mask(4).startend_row_indices[0, 0, :, 0].tolist()
    [4, 4, 4, 4]
    """
    lts = torch.full((seq_len,), seq_len)
    return _pack([[lts]] * batch_size, True, device)


def full_mask(seq_len: int, batch_size: int = 1, seq_q: int | None = None, device=None) -> FlashMask:
    """Full (bidirectional) attention: ``LTS_j = S_q, UTE_j = 0`` (C=2, non-causal); ``seq_q`` defaults to S.

    >>> full_mask(3).startend_row_indices[0, 0].tolist()
    [[3, 0], [3, 0], [3, 0]]
    """
    seq_q = seq_len if seq_q is None else seq_q
    cols = [torch.full((seq_len,), seq_q), torch.zeros(seq_len, dtype=torch.long)]
    return _pack([cols] * batch_size, False, device)


def sliding_window_mask(seq_len: int, window_size, causal: bool = True, sink_tokens: int = 0,
                        batch_size: int = 1, device=None) -> FlashMask:
    """Sliding window. Causal: query i sees keys ``[i-w, i]`` (``window_size=w``), ``LTS_j = min(j+w+1, S)``, C=1.
    Bidirectional: ``window_size=(wl, wr)``, query i sees ``[i-wl, i+wr]``, ``LTS_j = min(j+wl+1, S)``,
    ``UTE_j = max(j-wr, 0)``, C=2. ``sink_tokens`` leading keys are seen by every (later) query (``LTS = S``).
    Matches ``flashmask_attention(window_size=...)`` (Paddle's conversion).

    >>> sliding_window_mask(5, 1).startend_row_indices[0, 0, :, 0].tolist()
    [2, 3, 4, 5, 5]
    """
    wl, wr = _window(window_size, 0 if causal else -1)  # -1: wr = w
    _err(wl >= 0 and wr >= 0, f"window_size must be non-negative, got {window_size}")
    _err(not causal or wr == 0, f"a causal window takes window_size=w or (w, 0), got {window_size}")
    _err(0 <= sink_tokens <= seq_len, f"sink_tokens must be in [0, seq_len={seq_len}], got {sink_tokens}")
    j = torch.arange(seq_len)
    lts = torch.clamp(j + wl + 1, max=seq_len)
    lts[:sink_tokens] = seq_len
    if causal:
        return _pack([[lts]] * batch_size, True, device)
    ute = torch.clamp(j - wr, min=0)
    ute[:sink_tokens] = 0
    return _pack([[lts, ute]] * batch_size, False, device)


def causal_document_mask(lengths=None, *, cu_seqlens=None, seq_len: int | None = None, device=None) -> FlashMask:
    """Packed documents, causal inside each: ``LTS_j = end(doc(j))`` (C=1, causal); padding columns ``LTS = 0``
    (the layout of the collator's ``attn_mask_startend_row_indices``).

    Args: ``lengths`` per row, or flash-attn style ``cu_seqlens`` (``[0, 3, 6, 8]``) per row; ``seq_len`` pads.

    >>> causal_document_mask([3, 3, 2]).startend_row_indices[0, 0, :, 0].tolist()
    [3, 3, 3, 6, 6, 6, 8, 8]
    """
    rows, seq_len = _doc_rows(lengths, cu_seqlens, seq_len)
    return _pack([[_doc_cols(r, seq_len)[1]] for r in rows], True, device)


def document_mask(lengths=None, *, cu_seqlens=None, seq_len: int | None = None, device=None) -> FlashMask:
    """Packed documents, bidirectional inside each: ``LTS_j = end(doc(j)), UTE_j = start(doc(j))`` (C=2,
    non-causal); padding columns ``LTS = 0, UTE = S`` (fully masked by both intervals, which keeps the tile
    min/max of :func:`classify_blocks` tight).

    >>> document_mask([2, 1]).startend_row_indices[0, 0].tolist()
    [[2, 0], [2, 0], [3, 2]]
    """
    rows, seq_len = _doc_rows(lengths, cu_seqlens, seq_len)
    cols = []
    for r in rows:
        start, end, real = _doc_cols(r, seq_len)
        cols.append([end, torch.where(real, start, seq_len)])
    return _pack(cols, False, device)


def share_question_mask(samples, seq_len: int | None = None, device=None) -> FlashMask:
    """Shared question (DPO / reward-model packs): a sample is a prompt followed by k answers, each answer sees
    the prompt and itself only. Question columns: ``LTS = end of the sample``; answer-a columns: ``LTS = end of
    answer a`` (C=1, causal). Padding columns ``LTS = 0``.

    Args: ``samples``: one row ``[(prompt_len, [answer_len, ...]), ...]`` or a list of such rows.

    >>> share_question_mask([(3, [3, 2])]).startend_row_indices[0, 0, :, 0].tolist()
    [8, 8, 8, 6, 6, 6, 8, 8]
    """
    _err(isinstance(samples, (list, tuple)) and len(samples) > 0, f"samples must be a non-empty list, got {samples!r}")

    def is_sample(x) -> bool:  # (prompt_len, [answer_len, ...])
        return (isinstance(x, (list, tuple)) and len(x) == 2 and isinstance(x[0], Integral)
                and isinstance(x[1], (list, tuple)) and all(isinstance(a, Integral) for a in x[1]))

    rows = [list(samples)] if is_sample(samples[0]) else [list(r) for r in samples]
    for b, row in enumerate(rows):
        _err(all(is_sample(x) for x in row), f"samples row {b}: each sample must be (prompt_len, [answer_len, ...]), "
             f"e.g. [(3, [3, 2])], got {row!r}")
    lens = [[p + sum(a) for p, a in r] for r in rows]
    seq_len = max(sum(x) for x in lens) if seq_len is None else seq_len
    cols = []
    for b, row in enumerate(rows):
        _err(sum(lens[b]) <= seq_len, f"samples of row {b} hold {sum(lens[b])} tokens, more than seq_len={seq_len}")
        lts, pos = [], 0
        for p, answers in row:
            _err(p >= 0 and all(a >= 0 for a in answers), f"row {b}: lengths must be >= 0, got {(p, answers)}")
            end = pos + p + sum(answers)
            lts += [end] * p
            pos += p
            for a in answers:
                lts += [pos + a] * a
                pos += a
        cols.append([torch.tensor(lts + [0] * (seq_len - pos), dtype=torch.long)])
    return _pack(cols, True, device)


def preference_mask(response_indexs, batch_size: int, seq_len: int, device=None) -> FlashMask:
    """Share-question mask of a packed DPO / RM batch from its ``response_indexs`` (docs/design.md §2).

    Each row ``[batch_row, chosen_start, rejected_start, end]`` is one pair: prompt ``[prev_end, chosen_start)``
    (the previous pair's end in that batch row, or 0: packs are contiguous), chosen ``[chosen_start,
    rejected_start)``, rejected ``[rejected_start, end)``. Gives PaddleNLP's ``[S]*P ++ [P+R0]*R0 ++ [S]*R1``
    per pair (``llm/alignment/dpo`` preprocessing, offset by the pair's start); uncovered tail columns are
    padding (``LTS = 0``). C=1, causal.

    Raises:
        ValueError: pairs of one row that overlap or are not in order, or indices outside ``[0, seq_len]``.

    >>> preference_mask([[0, 2, 6, 9]], 1, 10).startend_row_indices[0, 0, :, 0].tolist()
    [9, 9, 6, 6, 6, 6, 9, 9, 9, 0]
    """
    ri = torch.as_tensor(response_indexs, dtype=torch.long).reshape(-1, 4).tolist()
    lts = torch.zeros(batch_size, seq_len, dtype=torch.long)
    prev_end = [0] * batch_size
    for k, (b, c0, r0, end) in enumerate(ri):
        _err(0 <= b < batch_size and prev_end[b] <= c0 <= r0 <= end <= seq_len,
             f"response_indexs[{k}] = {[b, c0, r0, end]} must satisfy 0 <= batch_row < {batch_size} and "
             f"previous end ({prev_end[b] if 0 <= b < batch_size else '?'}) <= chosen_start <= rejected_start "
             f"<= end <= seq_len={seq_len}")
        lts[b, prev_end[b]:c0] = end  # prompt: seen by the whole pair
        lts[b, c0:r0] = r0  # chosen: hidden from the rejected response
        lts[b, r0:end] = end
        prev_end[b] = end
    sri = lts[:, None, :, None].to(torch.int32)
    return FlashMask(sri.to(device) if device is not None else sri, True)


def global_sliding_window_mask(seq_len: int, global_tokens: int, window_size, batch_size: int = 1,
                               device=None) -> FlashMask:
    """``global_tokens`` leading tokens see and are seen by all; the rest use a bidirectional window
    ``(wl, wr)`` (C=4, non-causal). Paddle generator formula: ``LTS_j = min(j+wl+1, S)``, ``LTS[:g] = S``,
    ``LTE = S``, ``UTS = g``, ``UTS[:g+wr+1] = 0``, ``UTE_j = j-wr``, ``UTE[:g+wr+1] = 0``.

    >>> global_sliding_window_mask(5, 1, (1, 1)).startend_row_indices[0, 0, :, 0].tolist()
    [5, 3, 4, 5, 5]
    """
    wl, wr = _window(window_size, -1)
    _err(wl >= 0 and wr >= 0 and 0 <= global_tokens <= seq_len,
         f"need window_size >= 0 and 0 <= global_tokens <= seq_len={seq_len}, got {window_size}, {global_tokens}")
    j = torch.arange(seq_len)
    lts = torch.clamp(j + wl + 1, max=seq_len)
    lts[:global_tokens] = seq_len
    lte = torch.full((seq_len,), seq_len)
    uts = torch.full((seq_len,), global_tokens)
    ute = torch.clamp(j - wr, min=0, max=seq_len)
    uts[: global_tokens + wr + 1] = 0
    ute[: global_tokens + wr + 1] = 0
    return _pack([[lts, lte, uts, ute]] * batch_size, False, device)


def causal_blockwise_mask(lengths=None, *, cu_seqlens=None, seq_len: int | None = None, device=None) -> FlashMask:
    """Causal documents where the last document of each row sees all earlier documents (C=2, causal):
    ``LTS_j = end(doc(j))``; ``LTE_j = start(last)`` before the last document, ``S`` inside it.
    Padding columns are fully masked, but padding rows still see the earlier documents (one interval per
    column cannot also cover the padding rows); their outputs must be ignored.

    >>> causal_blockwise_mask([2, 1, 2]).startend_row_indices[0, 0].tolist()
    [[2, 3], [2, 3], [3, 3], [5, 5], [5, 5]]
    """
    rows, seq_len = _doc_rows(lengths, cu_seqlens, seq_len)
    cols = []
    for r in rows:
        r = [x for x in r if x > 0]
        _, end, real = _doc_cols(r, seq_len)
        s_last = sum(r[:-1]) if r else 0
        lts = torch.where(real, end, 0)
        lte = torch.where(torch.arange(seq_len) < s_last, s_last, seq_len)
        cols.append([lts, lte])
    return _pack(cols, True, device)


def block_causal_mask(lengths=None, *, cu_seqlens=None, seq_len: int | None = None, device=None) -> FlashMask:
    """Block-causal (chunked bidirectional): chunk c sees chunks ``<= c``, bidirectionally inside itself:
    ``LTS = n, UTE_j = start(chunk(j))`` (C=2, non-causal; n = real tokens of the row, = S without padding);
    padding columns ``LTS = 0, UTE = S``.

    >>> block_causal_mask([2, 1]).startend_row_indices[0, 0].tolist()
    [[3, 0], [3, 0], [3, 2]]
    """
    rows, seq_len = _doc_rows(lengths, cu_seqlens, seq_len)
    cols = []
    for r in rows:
        start, _, real = _doc_cols(r, seq_len)
        # LTS = n: padding rows see nothing; padding columns LTS = 0, UTE = S
        cols.append([torch.where(real, sum(r), 0), torch.where(real, start, seq_len)])
    return _pack(cols, False, device)


def prefix_lm_causal_mask(seq_len: int, prefix_len, batch_size: int = 1, device=None) -> FlashMask:
    """Prefix LM: the first ``P`` tokens attend bidirectionally, the rest causally (C=2, non-causal):
    ``LTS = S``, ``UTE_j = 0 if j < P else j``. ``prefix_len`` is an int or one int per batch row.

    >>> prefix_lm_causal_mask(4, 2).startend_row_indices[0, 0, :, 1].tolist()
    [0, 0, 2, 3]
    """
    j = torch.arange(seq_len)
    cols = []
    for p in _per_row(prefix_len, batch_size, "prefix_len"):
        _err(0 <= p <= seq_len, f"prefix_len must be in [0, seq_len={seq_len}], got {p}")
        cols.append([torch.full((seq_len,), seq_len), torch.where(j < p, 0, j)])
    return _pack(cols, False, device)


def prefix_lm_document_mask(lengths, prefix_lengths, seq_len: int | None = None, device=None) -> FlashMask:
    """Packed prefix-LM documents (C=2, non-causal): ``LTS_j = end(doc)``, ``UTE_j = start(doc)`` inside the
    document's prefix ``[s, s+P)``, else ``j``. Padding columns ``LTS = 0, UTE = S``. ``prefix_lengths`` mirrors
    ``lengths`` (one prefix per document).

    >>> prefix_lm_document_mask([2, 2], [1, 2]).startend_row_indices[0, 0].tolist()
    [[2, 0], [2, 1], [4, 2], [4, 2]]
    """
    rows, seq_len = _doc_rows(lengths, None, seq_len)
    prows = _as_rows(prefix_lengths, "prefix_lengths")
    _err(len(prows) == len(rows) and all(len(p) == len(r) for p, r in zip(prows, rows)),
         f"prefix_lengths must have the shape of lengths, got {prows} for {rows}")
    j = torch.arange(seq_len)
    cols = []
    for r, p in zip(rows, prows):
        _err(all(0 <= a <= b for a, b in zip(p, r)), f"each prefix must be in [0, len(doc)], got {p} for {r}")
        start, end, real = _doc_cols(r, seq_len)
        plen = torch.cat([torch.repeat_interleave(torch.tensor(p, dtype=torch.long), torch.tensor(r)),
                          torch.zeros(seq_len - sum(r), dtype=torch.long)])
        cols.append([end, torch.where(real, torch.where(j < start + plen, start, j), seq_len)])
    return _pack(cols, False, device)


def qk_sparse_mask(seq_len: int, ranges: Sequence[tuple[int, int]], batch_size: int = 1, device=None) -> FlashMask:
    """QK-sparse: for each ``(a, b)`` in ``ranges`` the keys ``[a, b)`` are removed for the queries ``[a, b)``
    (so those queries see only keys ``< a``; rows with a=0 see nothing). C=2, causal:
    ``LTS_j = j, LTE_j = b`` for ``j in [a, b)``, else ``LTS = LTE = S``. Ranges must not overlap.

    >>> qk_sparse_mask(4, [(1, 3)]).startend_row_indices[0, 0].tolist()
    [[4, 4], [1, 3], [2, 3], [4, 4]]
    """
    lts = torch.full((seq_len,), seq_len)
    lte = torch.full((seq_len,), seq_len)
    taken = torch.zeros(seq_len, dtype=torch.bool)
    _err(isinstance(ranges, (list, tuple)) and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in ranges),
         f"ranges must be a list of (a, b) pairs, e.g. [(1, 3)], got {ranges!r}")
    for a, b in ranges:
        _err(0 <= a <= b <= seq_len, f"qk_sparse range must satisfy 0 <= a <= b <= seq_len={seq_len}, got {(a, b)}")
        _err(not taken[a:b].any(), f"qk_sparse ranges overlap at {(a, b)}")
        taken[a:b] = True
        lts[a:b] = torch.arange(a, b)
        lte[a:b] = b
    return _pack([[lts, lte]] * batch_size, True, device)


def random_eviction_mask(seq_len: int, evict_prob: float = 0.5, num_heads: int = 1, batch_size: int = 1,
                         seed: int = 0, device=None) -> FlashMask:
    """Random KV eviction (C=1, causal, one mask per head): with probability ``evict_prob`` key j is evicted
    from a row ``r_j`` drawn uniformly from ``[j+1, S)`` on, i.e. ``LTS_j = r_j``; otherwise ``LTS_j = S``.
    Deterministic for a given ``seed`` (a private CPU ``torch.Generator``). Returns ``[B, num_heads, S, 1]``.

    >>> random_eviction_mask(4, 1.0, seed=0).startend_row_indices.shape
    torch.Size([1, 1, 4, 1])
    """
    _err(0.0 <= evict_prob <= 1.0, f"evict_prob must be in [0, 1], got {evict_prob}")
    _err(num_heads >= 1 and batch_size >= 1, f"num_heads and batch_size must be >= 1, got {num_heads}, {batch_size}")
    g = torch.Generator().manual_seed(seed)
    j = torch.arange(seq_len)
    u = torch.rand(batch_size, num_heads, seq_len, generator=g)
    r = j + 1 + (torch.rand(batch_size, num_heads, seq_len, generator=g) * (seq_len - j - 1)).long()
    lts = torch.where((u < evict_prob) & (r < seq_len), r, seq_len)  # [B, H, S]
    sri = lts[..., None].to(torch.int32)
    return FlashMask(sri.to(device) if device is not None else sri, True)


def key_padding_mask(valid_lengths, seq_len: int, causal: bool = False, device=None) -> FlashMask:
    """Key padding: row b has ``n_b`` real tokens; padded key columns get ``LTS = 0`` (masked for every query).
    Non-causal: C=2 with ``UTE = 0``; causal: C=1. ``valid_lengths`` is an int list, one per batch row.

    >>> key_padding_mask([2], 3).startend_row_indices[0, 0].tolist()
    [[3, 0], [3, 0], [0, 0]]
    """
    cols = []
    for n in _valid_lengths(valid_lengths, seq_len):
        lts = torch.where(torch.arange(seq_len) < n, seq_len, 0)
        cols.append([lts] if causal else [lts, torch.zeros(seq_len, dtype=torch.long)])
    return _pack(cols, causal, device)


def query_padding_mask(valid_lengths, seq_len: int, causal: bool = True, device=None) -> FlashMask:
    """Query padding tail: rows ``>= n_b`` attend to nothing (output 0): ``LTS_j = n_b`` for every column
    (C=1 causal, or C=2 with ``UTE = 0``). ``valid_lengths``: one int per batch row.

    >>> query_padding_mask([2], 3).startend_row_indices[0, 0, :, 0].tolist()
    [2, 2, 2]
    """
    cols = []
    for n in _valid_lengths(valid_lengths, seq_len):
        lts = torch.full((seq_len,), n)
        cols.append([lts] if causal else [lts, torch.zeros(seq_len, dtype=torch.long)])
    return _pack(cols, causal, device)


# ------------------------------------------------------------------------------------ dense <-> vectors

def from_dense(allowed: torch.Tensor, causal: bool) -> FlashMask:
    """Most compact FlashMask vectors for a dense allowed-mask (the converter of FlashMask §1.4).

    Args:
        allowed: bool ``[B, H, S_q, S_k]``, True = query row i may attend to key column j.
        causal: target mode. Causal needs ``S_q == S_k`` and nothing allowed above the diagonal; then C=1 when
            every column's masked rows (below the diagonal) are one suffix, else C=2 (one interval). Non-causal:
            C=2 when each column's visible rows are one run, else C=4 (at most two masked intervals).

    Returns:
        :class:`FlashMask` with int32 ``[B, H, S_k, C]`` and ``to_dense(result) == allowed``.

    Raises:
        ValueError: a column needs more masked intervals than the mode allows (the message names batch, head,
            column and the number of intervals found), or allowed entries above the diagonal when causal.
    """
    _err(isinstance(allowed, torch.Tensor) and allowed.dtype == torch.bool and allowed.dim() == 4,
         f"allowed must be a bool tensor [B, H, S_q, S_k], got "
         f"{(allowed.dtype, list(allowed.shape)) if isinstance(allowed, torch.Tensor) else type(allowed).__name__}")
    b, h, s_q, s_k = allowed.shape
    dev = allowed.device
    i = torch.arange(s_q, device=dev)[:, None]  # [S_q, 1]
    j = torch.arange(s_k, device=dev)[None, :]  # [1, S_k]
    masked = ~allowed
    if causal:
        _err(s_q == s_k, f"from_dense(causal=True) needs S_q == S_k, got S_q={s_q}, S_k={s_k}")
        bad = (allowed & (j > i)).nonzero()
        _err(len(bad) == 0, "from_dense(causal=True): allowed[batch, head, query, key] = True above the diagonal "
             f"at {tuple(bad[0].tolist()) if len(bad) else None}; use causal=False")
        masked = masked & (i >= j)  # rows above the diagonal are covered by the implicit causal interval
    prev = torch.nn.functional.pad(masked, (0, 0, 1, 0))[..., :-1, :]  # masked[i-1]
    nxt = torch.nn.functional.pad(masked, (0, 0, 0, 1))[..., 1:, :]  # masked[i+1]
    starts = masked & ~prev  # [B, H, S_q, S_k]: a masked run starts at row i
    ends = masked & ~nxt  # a masked run ends at row i (exclusive end i+1)
    runs = starts.sum(dim=2)  # [B, H, S_k]
    big = s_q + 1
    st = torch.where(starts, i, big).sort(dim=2).values  # run starts, ascending, padded with `big`
    en = torch.where(ends, i + 1, big).sort(dim=2).values
    pad2 = torch.full((b, h, max(0, 2 - s_q), s_k), big, dtype=st.dtype, device=dev)
    st, en = torch.cat([st, pad2], 2), torch.cat([en, pad2], 2)
    st1, st2, en1, en2 = st[:, :, 0], st[:, :, 1], en[:, :, 0], en[:, :, 1]  # [B, H, S_k]

    budget = 1 if causal else 2
    if (runs > budget).any():
        bb, hh, jj = (runs > budget).nonzero()[0].tolist()
        raise ValueError(
            f"from_dense: column {jj} (batch {bb}, head {hh}) has {int(runs[bb, hh, jj])} masked row intervals; "
            f"causal={causal} allows at most {budget} (+ the causal triangle); FlashMask cannot express this mask")
    full_q = torch.full_like(st1, s_q)
    zero = torch.zeros_like(st1)
    if causal:
        lts = torch.where(runs == 1, st1, full_q)
        lte = torch.where(runs == 1, en1, full_q)
        vecs = [lts] if bool((lte == s_q).all()) else [lts, lte]
    else:
        # C=2 works when the masked rows are at most a prefix [0, UTE) and a suffix [LTS, S_q)
        prefix = (runs >= 1) & (st1 == 0)
        suffix_start = torch.where(runs == 2, st2, torch.where((runs == 1) & (st1 > 0), st1, full_q))
        suffix_end = torch.where(runs == 2, en2, torch.where((runs == 1) & (st1 > 0), en1, full_q))
        if bool((suffix_end == s_q).all()):
            vecs = [suffix_start, torch.where(prefix, en1, zero)]
        else:  # two general intervals: the first (upper) one -> [UTS, UTE), the second (lower) -> [LTS, LTE)
            two = runs == 2
            one_low = (runs == 1) & (st1 > 0)  # a single run not touching row 0 goes to the lower interval
            lts = torch.where(two, st2, torch.where(one_low, st1, full_q))
            lte = torch.where(two, en2, torch.where(one_low, en1, full_q))
            up = two | ((runs == 1) & ~one_low)
            vecs = [lts, lte, torch.where(up, st1, zero), torch.where(up, en1, zero)]
    return FlashMask(torch.stack(vecs, dim=-1).to(torch.int32), causal)


# ------------------------------------------------------------------------------------ tile classification

SKIP, PARTIAL, UNMASKED = 0, 1, 2


def block_min_max(startend_row_indices: torch.Tensor, causal: bool, block_n: int,
                  seq_q: int | None = None) -> dict[str, torch.Tensor]:
    """Per key block min and max of each vector (the kernel's O(N) preprocessing, FlashMask §2.1).

    Returns ``{"LTS_max", "LTS_min", "LTE_max", ..., "UTE_min"}``, each int64 ``[B, H_mask, ceil(S_k/block_n)]``,
    with the absent vectors filled by their defaults (causal: ``UTE_j = j``). A tail block uses only its
    valid columns.
    """
    s_k = startend_row_indices.shape[2]
    seq_q = s_k if seq_q is None else seq_q
    tc = -(-s_k // block_n)
    out = {}
    for name, v in zip(("LTS", "LTE", "UTS", "UTE"), expand_startend(startend_row_indices, causal, seq_q)):
        pad = tc * block_n - s_k
        hi = torch.nn.functional.pad(v, (0, pad), value=-1).unflatten(-1, (tc, block_n))
        lo = torch.nn.functional.pad(v, (0, pad), value=2**31).unflatten(-1, (tc, block_n))
        out[f"{name}_max"], out[f"{name}_min"] = hi.amax(-1), lo.amin(-1)
    return out


def classify_blocks(startend_row_indices: torch.Tensor, causal: bool, block_m: int, block_n: int,
                    seq_q: int | None = None) -> torch.Tensor:
    """Classify ``block_m x block_n`` tiles from per-block min/max only (FlashMask §2.2, conservative).

    Row block ``[r0, r1)`` (``r1 = min(r0 + block_m, S_q)``) against key block j:
    skip (0) if ``(r0 >= LTS_max and r1 <= LTE_min) or (r1 <= UTE_min and r0 >= UTS_max)``; partial (1) if
    ``(r1 > LTS_min and r0 < LTE_max) or (r0 < UTE_max and r1 > UTS_min)``; else unmasked (2). Causal mode uses
    ``UTS = 0, UTE_j = j``, so tiles above the diagonal are skipped and diagonal tiles are partial.
    The result is sound, not exact: a tile reported skip is fully masked and one reported unmasked is fully
    allowed, but min/max over different columns can leave a fully masked or fully allowed tile "partial"
    (e.g. a tile masked only by the union of two intervals, or columns with empty ``LTS = LTE`` intervals).

    Returns:
        int8 ``[B, H_mask, ceil(S_q/block_m), ceil(S_k/block_n)]`` with values in {0, 1, 2}.
    """
    s_k = startend_row_indices.shape[2]
    seq_q = s_k if seq_q is None else seq_q
    mm = {k: v[:, :, None, :] for k, v in block_min_max(startend_row_indices, causal, block_n, seq_q).items()}
    r0 = torch.arange(0, seq_q, block_m, device=startend_row_indices.device)[:, None]  # [Tr, 1]
    r1 = torch.clamp(r0 + block_m, max=seq_q)
    skip = ((r0 >= mm["LTS_max"]) & (r1 <= mm["LTE_min"])) | ((r1 <= mm["UTE_min"]) & (r0 >= mm["UTS_max"]))
    partial = ((r1 > mm["LTS_min"]) & (r0 < mm["LTE_max"])) | ((r0 < mm["UTE_max"]) & (r1 > mm["UTS_min"]))
    return torch.where(skip, SKIP, torch.where(partial, PARTIAL, UNMASKED)).to(torch.int8)
