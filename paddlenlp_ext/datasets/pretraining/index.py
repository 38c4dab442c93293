"""The sample index of a pretraining split, exactly as PaddleNLP builds it, in numpy.

Source: PaddleNLP ``paddlenlp/data/causal_dataset.py`` (``get_train_valid_test_split_``, ``_num_epochs``,
``_build_doc_idx``, ``_build_shuffle_idx``, ``_build_index_mappings``) and its C++ helpers ``build_sample_idx`` /
``build_blending_indices`` (the same algorithms as Megatron-LM's ``helpers.cpp``). Given the same sizes, seed and
sample count the arrays are identical to theirs; the C++ loops are replaced by ``np.searchsorted`` and a numpy
greedy loop, so no compiled helper is needed.

Notation: ``L`` = ``max_seq_length``; a sample is ``L + 1`` tokens and consecutive samples share one token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def parse_split(split: str) -> list[float]:
    """``"949,50,1"`` (or ``"949/50/1"``, or one number) -> the three normalised weights (PaddleNLP's rule: pad
    with 0 to three, keep the first three, divide by the sum).

    Raises ValueError (naming ``split``) when it does not parse, holds a negative number or sums to 0.
    """
    text = str(split).strip()
    parts = text.split(",") if "," in text else text.split("/") if "/" in text else [text]
    try:
        weights = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"split={split!r} does not parse: write three numbers such as \"949,50,1\" "
                         "(train, validation, test weights)") from None
    weights = (weights + [0.0, 0.0, 0.0])[:3]
    if any(w < 0 or not math.isfinite(w) for w in weights) or sum(weights) <= 0:
        raise ValueError(f"split={split!r}: the weights must be finite, >= 0 and not all 0, e.g. \"949,50,1\"")
    total = sum(weights)
    return [w / total for w in weights]


def split_bounds(split: str, size: int) -> list[int]:
    """``[0, a, b, size]``: sequences ``[0, a)`` train, ``[a, b)`` validation, ``[b, size)`` test.

    PaddleNLP ``get_train_valid_test_split_``: ``idx[k+1] = idx[k] + round(w_k * size)`` (Python's round, half to
    even), then the overshoot ``idx[3] - size`` is subtracted from each of ``idx[1..3]``.
    """
    weights = parse_split(split)
    idx = [0]
    for w in weights:
        idx.append(idx[-1] + int(round(w * float(size))))
    diff = idx[-1] - size
    for k in range(1, 4):
        idx[k] -= diff
    if idx[-1] != size:
        raise AssertionError(f"split bounds {idx} do not end at {size}")
    return idx


def num_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Smallest ``E >= 1`` with ``(E * T - 1) // L >= num_samples`` (PaddleNLP ``_num_epochs``)."""
    if tokens_per_epoch <= 0:
        raise ValueError("tokens_per_epoch must be > 0")
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


def separate_last_epoch(tokens_per_epoch: int, seq_length: int, num_samples: int, epochs: int) -> bool:
    """PaddleNLP's rule: with more than one epoch, the last epoch is shuffled on its own when fewer than 80 % of
    its samples are needed."""
    if epochs == 1:
        return False
    before = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
    last = num_samples - before
    per = (tokens_per_epoch - 1) // seq_length
    if not 0 <= last <= per + 1:
        raise AssertionError(f"last-epoch samples {last} out of [0, {per + 1}]")
    return last < int(0.80 * per)


def build_doc_idx(documents: np.ndarray, epochs: int, rng: np.random.RandomState, separate_last: bool) -> np.ndarray:
    """int32 ``[epochs * len(documents)]``: the documents tiled ``epochs`` times and shuffled by ``rng``; with
    ``separate_last`` the first ``epochs - 1`` and the last epoch are shuffled separately (PaddleNLP
    ``_build_doc_idx``)."""
    documents = np.asarray(documents, dtype=np.int32)
    if not separate_last or epochs == 1:
        doc_idx = np.tile(documents, epochs)
        rng.shuffle(doc_idx)
        return doc_idx
    first = build_doc_idx(documents, epochs - 1, rng, False)
    last = build_doc_idx(documents, 1, rng, False)
    return np.concatenate((first, last))


def build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, epochs: int,
                     tokens_per_epoch: int) -> np.ndarray:
    """``[S + 1, 2]`` (int32, int64 when offsets need it): entry ``k`` = (position in ``doc_idx``, token offset
    in that document) of the first token of sample ``k``, which is also the last token of sample ``k - 1``.

    Same result as the C++ ``build_sample_idx`` loop: sample ``k`` starts at token ``k * L`` of the documents
    concatenated in ``doc_idx`` order, ``S = (epochs * T - 1) // L``; an empty document is never the one named
    (entry 0 is always ``(0, 0)``).
    """
    num = (epochs * tokens_per_epoch - 1) // seq_length
    lengths = np.asarray(sizes, dtype=np.int64)[doc_idx]
    ends = np.empty(len(lengths) + 1, dtype=np.int64)
    ends[0] = 0
    np.cumsum(lengths, out=ends[1:])
    starts = np.arange(num + 1, dtype=np.int64) * seq_length
    pos = np.searchsorted(ends, starts, side="right") - 1
    off = starts - ends[pos]
    dtype = np.int32 if max(len(doc_idx), int(lengths.max(initial=0))) < 2**31 else np.int64
    out = np.empty((num + 1, 2), dtype=dtype)
    out[:, 0], out[:, 1] = pos, off
    out[0] = 0
    return out


def build_shuffle_idx(num_samples: int, total_size: int, rng: np.random.RandomState) -> np.ndarray:
    """Permutation of ``[0, num_samples)`` followed by an independent permutation of ``[num_samples, total_size)``
    (uint32; int64 from ``2**32 - 2`` samples) (PaddleNLP ``_build_shuffle_idx``)."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(0, num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


@dataclass
class SampleIndex:
    """The three arrays of one (prefix, split): ``doc_idx``, ``sample_idx``, ``shuffle_idx``; ``len`` = samples."""

    doc_idx: np.ndarray
    sample_idx: np.ndarray
    shuffle_idx: np.ndarray

    def __len__(self) -> int:
        return self.sample_idx.shape[0] - 1


def build_index(sizes: np.ndarray, documents: np.ndarray, seq_length: int, num_samples: int,
                seed: int) -> SampleIndex:
    """PaddleNLP ``_build_index_mappings`` without the cache: enough epochs over ``documents`` (sequence ids) for
    ``num_samples`` samples of ``seq_length + 1`` tokens, one ``np.random.RandomState(seed)`` for the document
    shuffles then the sample shuffle. ``len`` of the result is ``>= num_samples``.

    Raises ValueError when the documents hold fewer than ``seq_length + 1`` tokens (not one whole window).
    """
    documents = np.asarray(documents)
    tokens = int(np.asarray(sizes, dtype=np.int64)[documents].sum())
    if tokens < seq_length + 1:
        raise ValueError(f"{tokens} tokens, fewer than one window of max_seq_length + 1 = {seq_length + 1}")
    epochs = num_epochs(tokens, seq_length, num_samples)
    separate = separate_last_epoch(tokens, seq_length, num_samples, epochs)
    rng = np.random.RandomState(seed=seed)
    doc_idx = build_doc_idx(documents, epochs, rng, separate)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, epochs, tokens)
    total = sample_idx.shape[0] - 1
    first = ((epochs - 1) * tokens - 1) // seq_length if separate else total
    shuffle_idx = build_shuffle_idx(first, total, rng)
    return SampleIndex(doc_idx, sample_idx, shuffle_idx)


def blending_indices(weights, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_index, dataset_sample_index)`` of ``size`` blended samples: at step ``i`` the dataset ``k``
    with the largest ``w_k * max(i, 1) - count_k`` (lowest ``k`` on ties) gives its next sample (PaddleNLP /
    Megatron-LM ``build_blending_indices``). ``dataset_index`` is uint8 (int16 from 255 datasets), the sample
    index int64."""
    w = [float(x) for x in weights]
    counts = [0] * len(w)
    picks, nth = [0] * size, [0] * size
    for i in range(size):  # a plain loop over a few datasets beats numpy's per-call overhead here
        s = max(i, 1)
        best, k = w[0] * s - counts[0], 0
        for d in range(1, len(w)):
            err = w[d] * s - counts[d]
            if err > best:  # strict: the lowest index wins ties, as in the C++ helper
                best, k = err, d
        picks[i], nth[i] = k, counts[k]
        counts[k] += 1
    return (np.asarray(picks, dtype=np.uint8 if len(w) < 255 else np.int16), np.asarray(nth, dtype=np.int64))


def blend_num_samples(weights, num_samples: int) -> tuple[list[float], list[int]]:
    """Normalised weights and per-dataset sample targets ``ceil(n * w * 1.005) + 20`` (PaddleNLP
    ``get_datasets_weights_and_num_samples``)."""
    total = float(sum(weights))
    if total <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"blend weights must be >= 0 and not all 0, got {list(weights)}")
    norm = [float(w) / total for w in weights]
    return norm, [int(math.ceil(num_samples * w * 1.005)) + 20 for w in norm]
