"""Collator: packs (from :mod:`paddlenlp_ext.datasets.zero_padding`) -> the packed-batch dict of docs/design.md.

| key | dtype, shape | padding |
|---|---|---|
| ``input_ids`` | int64 ``[B, L]`` | ``pad_token_id`` |
| ``labels`` (and ``chosen_labels``/``rejected_labels``) | int64 ``[B, L]`` | -100 |
| ``position_ids`` | int64 ``[B, L]`` | 0 |
| ``attn_mask_startend_row_indices`` | int32 ``[B, 1, L, C]`` (C=1 for SFT) | 0: padding rows/columns fully masked |
| ``response_indexs`` | int64 ``[N_rows, 1 + k]`` | rows ``[batch_row, positions...]`` |

Source: PaddleNLP's SFT collator ``DataCollatorForSeq2Seq(padding="max_length")`` (spec 2.4 "Padding in the
collator"). Differences: one padding convention for SFT and preference packs (startend 0, labels -100;
PaddleNLP's DPO collator pads labels with 0 and startend with the last value), and startend gets the
trailing ``C`` axis that ``flashmask_attention`` takes.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from .zero_padding import INDEX_KEYS, STARTEND

IGNORE_INDEX = -100


def _pad_value(key: str, pad_token_id: int) -> Optional[int]:
    if key == "input_ids":
        return pad_token_id
    if key == "position_ids":
        return 0
    if key == "labels" or key.endswith("_labels"):
        return IGNORE_INDEX
    return None


def collate_packs(packs: Sequence[dict], max_length: int, pad_token_id: int = 0,
                  pad_to_multiple_of: Optional[int] = None,
                  index_keys: Optional[Dict[str, int]] = None) -> Dict[str, torch.Tensor]:
    """Right-pad packs into one batch.

    Args:
        packs: pack dicts (``input_ids``, ``labels``/``*_labels``, ``position_ids``,
            ``attn_mask_startend_row_indices`` of equal length ``N_b <= max_length``; optional index keys).
        max_length: the row length ``L`` (PaddleNLP pads packs to ``max_length``).
        pad_token_id: ``input_ids`` padding (the tokenizer's pad id; PaddleNLP uses EOS for Llama).
        pad_to_multiple_of: if set, ``L`` is the longest pack rounded up to a multiple of this (dynamic
            padding) instead of ``max_length``.
        index_keys: ``{key: k}``: each row of that key becomes ``[batch_row] + row[:k]`` (default
            :data:`~paddlenlp_ext.datasets.zero_padding.INDEX_KEYS`, ``response_indexs``: 3).

    Returns:
        The batch dict (table above). Other pack keys (e.g. ``seq_lens``) are not included.

    Raises:
        ValueError: empty ``packs``, a pack longer than ``max_length``, or keys of unequal length in a pack.
    """
    if not packs:
        raise ValueError("collate_packs got no packs")
    index_keys = INDEX_KEYS if index_keys is None else index_keys
    lens = [len(p["input_ids"]) for p in packs]
    if max(lens) > max_length:
        raise ValueError(f"a pack has {max(lens)} tokens, more than max_length={max_length}")
    length = max_length
    if pad_to_multiple_of:
        length = -(-max(lens) // pad_to_multiple_of) * pad_to_multiple_of
    bsz = len(packs)
    batch: Dict[str, torch.Tensor] = {}
    for key in packs[0]:
        value = _pad_value(key, pad_token_id)
        if value is None:
            continue
        out = torch.full((bsz, length), value, dtype=torch.int64)  # [B, L]
        for b, p in enumerate(packs):
            if len(p[key]) != lens[b]:
                raise ValueError(f"pack {b}: {key!r} has length {len(p[key])}, input_ids has {lens[b]}")
            out[b, : lens[b]] = torch.as_tensor(p[key], dtype=torch.int64)
        batch[key] = out
    first = packs[0][STARTEND][0] if lens[0] else 0
    cols = len(first) if isinstance(first, (list, tuple)) else 1
    sri = torch.zeros((bsz, 1, length, cols), dtype=torch.int32)  # [B, 1, L, C]
    for b, p in enumerate(packs):
        se = p[STARTEND]
        if len(se) != lens[b]:
            raise ValueError(f"pack {b}: {STARTEND} has length {len(se)}, input_ids has {lens[b]}")
        if lens[b]:
            sri[b, 0, : lens[b]] = torch.as_tensor(se, dtype=torch.int32).reshape(lens[b], cols)
    batch[STARTEND] = sri
    for key, k in index_keys.items():
        if key not in packs[0]:
            continue
        rows: List[List[int]] = [[b] + list(row[:k]) for b, p in enumerate(packs) for row in p[key]]
        batch[key] = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 1 + k)  # [N_rows, 1 + k]
    return batch


class PackCollator:
    """``DataLoader`` ``collate_fn`` wrapping :func:`collate_packs` with fixed settings."""

    def __init__(self, max_length: int, pad_token_id: int = 0, pad_to_multiple_of: Optional[int] = None,
                 index_keys: Optional[Dict[str, int]] = None):
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.index_keys = index_keys

    def __call__(self, packs: Sequence[dict]) -> Dict[str, torch.Tensor]:
        return collate_packs(packs, self.max_length, self.pad_token_id, self.pad_to_multiple_of, self.index_keys)
