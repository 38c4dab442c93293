"""Progressive sequence length (ERNIE-3.5-SE ``use_progressive_seq_len``): cut a packed batch to the warm-up length.

PaddleNLP (``Ernie35ForCausalLM.forward``, ``progressive_seq``) cuts ``input_ids`` and ``labels`` inside the model
before steps 500/1000/1500 (512/1024/2048 tokens). Packed batches carry more than that: position ids, FlashMask
vectors and, for DPO/RM, per-pair response spans whose positions index the full-length pack. So the trainer cuts
the whole batch *before* the forward, and every loss sees a consistent, shorter batch:

- ``[B, L]`` token keys (``input_ids``, ``labels``, ``position_ids``, ``chosen_labels``, ``rejected_labels``,
  ``attention_mask``) keep their first ``length`` columns;
- ``attn_mask_startend_row_indices`` ``[B, H, L, C]`` keeps its first ``length`` key columns, row indices
  clamped to ``length`` (a span that ended past the cut now ends at it);
- ``response_indexs`` ``[N, 4]`` (``[batch_row, chosen_start, rejected_start, end]``) keeps the pairs that end
  within the cut; the labels of the other pairs are cleared to -100 and their precomputed reference log-probs
  (``reference_chosen_logps`` / ``reference_rejected_logps``, ``[N]``) dropped with them. A pair cut in the
  middle would compare a truncated response with a whole one, so it is left out of the step instead.
"""

from __future__ import annotations

import torch

__all__ = ["cut_batch", "progressive_length", "PAIR_KEYS", "TOKEN_KEYS"]

IGNORE_INDEX = -100
STARTEND = "attn_mask_startend_row_indices"
TOKEN_KEYS = ("input_ids", "labels", "position_ids", "chosen_labels", "rejected_labels", "attention_mask")
PAIR_KEYS = ("reference_chosen_logps", "reference_rejected_logps")


def progressive_length(model, seq_len: int) -> int:
    """Tokens a training forward of ``model`` keeps of a ``seq_len``-long batch: ``model.training_seq_len(seq_len)``
    when the model has that method (ERNIE-3.5-SE causal LM and reward model) and is training, else ``seq_len``."""
    keep = getattr(model, "training_seq_len", None)
    if keep is None or not getattr(model, "training", False):
        return seq_len
    return min(int(keep(seq_len)), seq_len)


def cut_batch(batch: dict, length: int) -> dict:
    """The packed batch cut to its first ``length`` tokens (see the module docstring); ``batch`` itself when it is
    no longer than that. The input dict is not modified.

    Raises:
        ValueError: ``length < 1``.
    """
    if length < 1:
        raise ValueError(f"cut_batch: length must be >= 1, got {length}")
    seq_len = batch["input_ids"].shape[1]
    if length >= seq_len:
        return batch
    out = dict(batch)
    for key in TOKEN_KEYS:
        if key in out and out[key] is not None:
            out[key] = out[key][:, :length]
    if out.get(STARTEND) is not None:
        out[STARTEND] = out[STARTEND][:, :, :length].clamp(max=length)
    ri = out.get("response_indexs")
    if ri is not None and ri.numel():
        keep = ri[:, 3] <= length  # [N]: the pair's rejected response ends within the cut
        if not bool(keep.all()):
            for key in ("chosen_labels", "rejected_labels"):
                if key in out:
                    out[key] = _clear_spans(out[key], ri[~keep])
            out["response_indexs"] = ri[keep]
            for key in PAIR_KEYS:
                if key in out:
                    out[key] = out[key][keep.to(out[key].device)]
    return out


def _clear_spans(labels: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``labels`` ``[B, L']`` with -100 over ``[chosen_start, end)`` of each dropped pair row (clipped to ``L'``)."""
    labels = labels.clone()
    for b, start, _, end in rows.tolist():
        labels[b, start:end] = IGNORE_INDEX
    return labels
