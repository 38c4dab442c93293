"""SFT loss on packed batches: summed next-token cross entropy plus the number of label tokens.

The trainer divides the sum by the label-token count of the whole optimizer step (all micro-batches, all
data-parallel ranks), so the loss is a global token mean. PaddleNLP (``LlamaPretrainingCriterion``) instead
takes a token mean per micro-batch and averages micro-batches with equal weight (spec section 6, trap 10);
the token-weighted mean is the documented improvement.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def count_label_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Number of supervised tokens, int64 scalar on ``labels``' device: ``(labels != -100).sum()``."""
    return (batch["labels"] != IGNORE_INDEX).sum()


def count_real_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Non-padding tokens of a packed batch (int64 scalar), for tokens/s.

    A column ``j`` is real when its LTS ``attn_mask_startend_row_indices[b, 0, j, 0] > j`` (its example ends
    after it); SFT padding holds 0 and DPO/RM padding holds the pack length, both ``<= j``. Without that key,
    ``attention_mask.sum()`` or ``input_ids.numel()`` is used.
    """
    sri = batch.get("attn_mask_startend_row_indices")
    if sri is not None:
        lts = sri[:, 0, :, 0]  # [B, L]
        cols = torch.arange(lts.shape[-1], device=lts.device)
        return (lts > cols).sum()
    if batch.get("attention_mask") is not None:
        return batch["attention_mask"].sum()
    return torch.tensor(batch["input_ids"].numel())


def sft_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    """Summed cross entropy of ``model`` on a packed SFT batch.

    Args:
        model: ``forward(input_ids, position_ids=None, attn_mask_startend_row_indices=None) -> logits [B, L, V]``.
        batch: packed-batch dict (docs/design.md section 2): ``input_ids``/``labels``/``position_ids`` int64
            ``[B, L]``, ``attn_mask_startend_row_indices`` int32 ``[B, 1, L, 1]``; labels already shifted.

    Returns:
        ``(loss_sum, count, metrics)``: fp32 scalar sum of per-token cross entropy (nats) over labels != -100,
        int64 scalar token count, and ``{}`` (no extra metrics).
    """
    logits = model(input_ids=batch["input_ids"], position_ids=batch.get("position_ids"),
                   attn_mask_startend_row_indices=batch.get("attn_mask_startend_row_indices"))
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    labels = batch["labels"]
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"logits {list(logits.shape)} and labels {list(labels.shape)} disagree on [batch, seq]")
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum")
    return loss_sum, count_label_tokens(batch), {}
