"""Pretraining batches from windows of ``L + 1`` tokens, with optional document masks (Megatron-LM's flags).

PaddleNLP's ``run_pretrain`` collator gives ``input_ids = x[:, :-1]`` and ``labels = x[:, 1:]`` only: attention
crosses the documents packed in a window and positions run ``0..L-1`` across them. Megatron-LM's
``_get_ltor_masks_and_position_ids`` adds three switches, computed on the input tokens, which this collator
takes by the same names:

- ``reset_attention_mask``: a token after an end-of-document (EOD) token attends neither to it nor to anything
  before it; emitted as the FlashMask causal-document mask ``attn_mask_startend_row_indices`` int32
  ``[B, 1, L, 1]`` (column ``j`` holds the end, exclusive, of its document: LTS), which the kernel runs by skipping
  the masked tiles.
- ``reset_position_ids``: ``position_ids`` restart at 0 after each EOD (the EOD belongs to the document it ends).
- ``eod_mask_loss``: the label at an input EOD position (the first token of the next document, predicted from
  the EOD) is -100, not trained on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

IGNORE_INDEX = -100


def document_layout(input_ids: np.ndarray, eod_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lts, position_ids)`` int64 ``[B, L]`` for int64 ``input_ids [B, L]``: each document ends right after an
    EOD token (or at ``L``); ``lts[b, j]`` = end of ``j``'s document, ``position_ids[b, j]`` = offset of ``j`` in it."""
    bsz, length = input_ids.shape
    cols = np.arange(length, dtype=np.int64)
    is_eod = input_ids == eod_token_id
    end_here = np.where(is_eod, cols + 1, length)  # [B, L]
    lts = np.minimum.accumulate(end_here[:, ::-1], axis=1)[:, ::-1]
    start_after = np.where(is_eod, cols + 1, 0)
    starts = np.zeros_like(start_after)
    starts[:, 1:] = np.maximum.accumulate(start_after, axis=1)[:, :-1]
    return lts, cols[None, :] - starts


class PretrainingCollator:
    """``collate_fn`` for :class:`~paddlenlp_ext.datasets.pretraining.GPTDataset` windows (int64 ``[L + 1]`` each).

    Returns ``input_ids``, ``labels`` (int64 ``[B, L]``), plus ``position_ids`` (int64 ``[B, L]``) with
    ``reset_position_ids`` and ``attn_mask_startend_row_indices`` (int32 ``[B, 1, L, 1]``) with
    ``reset_attention_mask``. Without them the model runs plain causal attention over ``0..L-1`` (PaddleNLP).

    Raises ValueError when a flag needs ``eod_token_id`` and it is None, or the windows differ in length.
    """

    def __init__(self, eod_token_id: int | None, reset_attention_mask: bool = False,
                 reset_position_ids: bool = False, eod_mask_loss: bool = False):
        if eod_token_id is None and (reset_attention_mask or reset_position_ids or eod_mask_loss):
            raise ValueError("reset_attention_mask / reset_position_ids / eod_mask_loss need the end-of-document id: "
                             "the tokenizer has no eos_token; set eod_token_id")
        self.eod_token_id = eod_token_id
        self.reset_attention_mask, self.reset_position_ids = reset_attention_mask, reset_position_ids
        self.eod_mask_loss = eod_mask_loss

    def __call__(self, samples: Sequence[np.ndarray]) -> dict[str, torch.Tensor]:
        lengths = {len(s) for s in samples}
        if len(lengths) != 1:
            raise ValueError(f"pretraining windows differ in length: {sorted(lengths)}")
        x = np.stack([np.asarray(s, dtype=np.int64) for s in samples])  # [B, L + 1]
        inputs, labels = x[:, :-1], x[:, 1:].copy()
        batch = {"input_ids": torch.from_numpy(np.ascontiguousarray(inputs))}
        if self.eod_mask_loss:
            labels[inputs == self.eod_token_id] = IGNORE_INDEX
        batch["labels"] = torch.from_numpy(labels)
        if self.reset_attention_mask or self.reset_position_ids:
            lts, pos = document_layout(inputs, self.eod_token_id)
            if self.reset_position_ids:
                batch["position_ids"] = torch.from_numpy(np.ascontiguousarray(pos))
            if self.reset_attention_mask:
                batch["attn_mask_startend_row_indices"] = torch.from_numpy(
                    np.ascontiguousarray(lts, dtype=np.int32))[:, None, :, None]
        return batch
