"""A slow, plain-Python reading of PaddleNLP's pretraining index (``causal_dataset.py`` and the C++
``build_sample_idx`` / ``build_blending_indices`` loops), written loop by loop from the algorithm text, to check
the numpy implementation against. Only the RNG calls are numpy's (``RandomState.shuffle``), as in PaddleNLP."""

from __future__ import annotations

import math

import numpy as np


def ref_split(split: str, size: int) -> list[int]:
    if "," in split:
        parts = [float(s) for s in split.split(",")]
    elif "/" in split:
        parts = [float(s) for s in split.split("/")]
    else:
        parts = [float(split)]
    while len(parts) < 3:
        parts.append(0.0)
    parts = parts[:3]
    total = sum(parts)
    parts = [p / total for p in parts]
    idx = [0]
    for p in parts:
        idx.append(idx[-1] + int(round(p * float(size))))
    diff = idx[-1] - size
    for k in range(1, len(idx)):
        idx[k] -= diff
    return idx


def ref_epochs(tokens: int, seq: int, n: int) -> int:
    epochs, total = 0, 0
    while True:
        epochs += 1
        total += tokens
        if (total - 1) // seq >= n:
            return epochs


def ref_sample_idx(sizes, doc_idx, seq: int, epochs: int, tokens: int) -> list[tuple[int, int]]:
    num = (epochs * tokens - 1) // seq
    out = [(0, 0)]
    p, off = 0, 0
    while len(out) <= num:
        need = seq + 1
        while need != 0:
            avail = int(sizes[doc_idx[p]]) - off
            need -= avail
            if need <= 0:
                off += need + avail - 1
                need = 0
            else:
                p += 1
                off = 0
        out.append((p, off))
    return out


def ref_index(sizes, documents, seq: int, n: int, seed: int):
    tokens = sum(int(sizes[d]) for d in documents)
    epochs = ref_epochs(tokens, seq, n)
    separate = False
    if epochs > 1:
        before = ((epochs - 1) * tokens - 1) // seq
        per = (tokens - 1) // seq
        separate = (n - before) < int(0.80 * per)
    rng = np.random.RandomState(seed=seed)

    def tiled(e):
        arr = np.array([d for _ in range(e) for d in documents], dtype=np.int32)
        rng.shuffle(arr)
        return list(arr)

    doc_idx = tiled(epochs) if not separate else tiled(epochs - 1) + tiled(1)
    sample_idx = ref_sample_idx(sizes, doc_idx, seq, epochs, tokens)
    total = len(sample_idx) - 1
    first = ((epochs - 1) * tokens - 1) // seq if separate else total
    a = np.arange(first, dtype=np.uint32)
    rng.shuffle(a)
    shuffle = list(a)
    if first != total:
        b = np.arange(first, total, dtype=np.uint32)
        rng.shuffle(b)
        shuffle += list(b)
    return doc_idx, sample_idx, shuffle


def ref_windows(docs_tokens, sizes, documents, seq: int, n: int, seed: int) -> list[list[int]]:
    """Every sample's tokens, in dataset order, by walking the reference index token by token."""
    doc_idx, sample_idx, shuffle = ref_index(sizes, documents, seq, n, seed)
    out = []
    for j in shuffle:
        (f, of), (last, ol) = sample_idx[j], sample_idx[j + 1]
        toks = []
        for p in range(f, last + 1):
            doc = docs_tokens[doc_idx[p]]
            lo = of if p == f else 0
            hi = ol + 1 if p == last else len(doc)
            toks.extend(doc[lo:hi])
        out.append(toks)
    return out


def ref_blend(weights, size: int):
    total = sum(weights)
    w = [x / total for x in weights]
    counts = [0] * len(w)
    di, si = [], []
    for i in range(size):
        errs = [w[k] * max(i, 1) - counts[k] for k in range(len(w))]
        k = 0
        for d in range(1, len(w)):
            if errs[d] > errs[k]:
                k = d
        di.append(k)
        si.append(counts[k])
        counts[k] += 1
    return di, si


def ref_blend_targets(weights, n: int) -> list[int]:
    total = sum(weights)
    return [int(math.ceil(n * (x / total) * 1.005)) + 20 for x in weights]
