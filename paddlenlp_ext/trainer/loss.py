"""SFT loss on packed batches: summed next-token cross entropy plus the number of label tokens.

The trainer divides the sum by the label-token count of the whole optimizer step (all micro-batches, all
data-parallel ranks), so the loss is a global token mean. PaddleNLP (``LlamaPretrainingCriterion``) instead
takes a token mean per micro-batch and averages micro-batches with equal weight (spec section 6, trap 10);
the token-weighted mean is the documented improvement.

By default the head and the loss run fused (``paddlenlp_ext.ops.fused_linear_cross_entropy``: chunked over
tokens, the ``[tokens, vocab]`` fp32 logits never exist) when the model offers final hidden states and a plain
``lm_head`` and the logits are not vocab-parallel; the PaddleNLP key ``use_fused_linear_cross_entropy`` (copied
onto the model config by ``paddlenlp_ext.ops.set_llm_config``) switches it. PaddleNLP's default is False; ours is
True because the fused path computes the same formula (see ``sft_loss``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

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


def _vocab_parallel(head: nn.Module) -> bool:
    """True when the head weight is a DTensor on a mesh with a ``"tp"`` dim (TP: logits are vocab-sharded or
    all-gathered by the TP plan, and the loss goes through the logits)."""
    from torch.distributed.tensor import DTensor

    w = head.weight
    return isinstance(w, DTensor) and "tp" in (w.device_mesh.mesh_dim_names or ())


def use_fused_loss(model: nn.Module) -> bool:
    """Whether :func:`sft_loss` takes the fused head + loss path for ``model`` by default.

    Needs: ``model.model`` (trunk) and ``model.lm_head`` an exact ``nn.Linear`` (a LoRA-wrapped head is not),
    no tensor parallelism on the head, and ``use_fused_linear_cross_entropy`` on the model config (default
    True, see ``paddlenlp_ext.ops.FUSED_DEFAULTS``).
    """
    from paddlenlp_ext.ops import fused_flag

    trunk, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if not isinstance(trunk, nn.Module) or type(head) is not nn.Linear or _vocab_parallel(head):
        return False
    return fused_flag(getattr(model, "config", None), "use_fused_linear_cross_entropy")


def sft_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], *, fused: bool | None = None,
             skip_ignored: bool = True):
    """Summed cross entropy of ``model`` on a packed SFT batch.

    Two paths, equal up to floating-point rounding (tests/fused_ops):

    - unfused: ``logits = model(...)`` ``[B, L, V]`` then ``F.cross_entropy(logits.float(), ...)``; used under
      TP (vocab-parallel loss inside ``loss_parallel``), for models without a plain ``lm_head``, or with
      ``fused=False``.
    - fused (default where possible, :func:`use_fused_loss`): final hidden states and the head weight from
      ``paddlenlp_ext.distributed.hidden_states_and_head`` (the root forward runs, so FSDP2 hooks fire and the
      head's gradient flows through autograd into the FSDP-managed parameter), then
      ``paddlenlp_ext.ops.fused_linear_cross_entropy`` over the supervised tokens only.

    Args:
        model: ``forward(input_ids, position_ids=None, attn_mask_startend_row_indices=None) -> logits [B, L, V]``.
        batch: packed-batch dict (docs/design.md section 2): ``input_ids``/``labels``/``position_ids`` int64
            ``[B, L]``, ``attn_mask_startend_row_indices`` int32 ``[B, 1, L, 1]``; labels already shifted.
        fused: force the path (True raises if the model cannot take it); None = :func:`use_fused_loss`.
        skip_ignored: fused path only: the head runs on the rows whose label is not -100 (prompt and padding
            rows cost no head FLOPs). Their row count is read on the host once, before the forward, where the
            sync only waits for the batch's copy and the previous step.

    Returns:
        ``(loss_sum, count, metrics)``: fp32 scalar sum of per-token cross entropy (nats) over labels != -100,
        int64 scalar token count, and ``{}`` (no extra metrics).

    ERNIE-3.5-SE with ``use_progressive_seq_len`` may return a shorter sequence in training; the labels (and the
    count) are then cut to match, as PaddleNLP does inside its model.

    Raises:
        ValueError: logits / hidden states and labels disagree on ``[batch, seq]`` (other than that cut);
            ``fused=True`` for a model
            without ``model`` + plain ``lm_head`` or with a tensor-parallel head.
    """
    if fused is None:
        fused = use_fused_loss(model)
    elif fused and not (isinstance(getattr(model, "model", None), nn.Module)
                        and type(getattr(model, "lm_head", None)) is nn.Linear and not _vocab_parallel(model.lm_head)):
        raise ValueError("sft_loss(fused=True) needs model.model and a plain nn.Linear model.lm_head without tensor "
                         "parallelism; use fused=None/False (or use_fused_linear_cross_entropy=false)")
    if fused:
        return _fused_sft_loss(model, batch, skip_ignored)
    logits = model(input_ids=batch["input_ids"], position_ids=batch.get("position_ids"),
                   attn_mask_startend_row_indices=batch.get("attn_mask_startend_row_indices"))
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    labels = _labels_for(model, batch["labels"], logits.shape[:2], "logits")
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum")
    return loss_sum, (labels != IGNORE_INDEX).sum(), {}


def _labels_for(model: nn.Module, labels: torch.Tensor, got: torch.Size, what: str) -> torch.Tensor:
    """``labels`` ``[B, L]`` matched to the model output's ``[B, L']``: cut to ``L'`` when the model shortened the
    sequence itself (ERNIE-3.5-SE ``use_progressive_seq_len``, where PaddleNLP cuts the labels inside the model),
    else they must agree (ValueError naming both shapes)."""
    if tuple(got) == tuple(labels.shape):
        return labels
    progressive = bool(getattr(getattr(model, "config", None), "use_progressive_seq_len", False))
    if progressive and got[0] == labels.shape[0] and got[1] < labels.shape[1]:
        return labels[:, : got[1]]
    raise ValueError(f"{what} {list(got)} and labels {list(labels.shape)} disagree on [batch, seq]")


def _fused_sft_loss(model: nn.Module, batch: dict[str, torch.Tensor], skip_ignored: bool):
    from paddlenlp_ext.distributed import hidden_states_and_head
    from paddlenlp_ext.ops import fused_linear_cross_entropy

    labels = batch["labels"]
    flat = labels.reshape(-1)
    rows = (flat != IGNORE_INDEX).nonzero().squeeze(1) if skip_ignored else None  # host sync, before the forward
    hidden, weight = hidden_states_and_head(model, batch["input_ids"], position_ids=batch.get("position_ids"),
                                            attn_mask_startend_row_indices=batch.get("attn_mask_startend_row_indices"))
    if hidden.shape[:2] != labels.shape:  # the model cut the sequence (progressive length): cut the labels too
        labels = _labels_for(model, labels, hidden.shape[:2], "hidden states")
        flat = labels.reshape(-1)
        rows = (flat != IGNORE_INDEX).nonzero().squeeze(1) if skip_ignored else None
    from torch.distributed.tensor import DTensor

    bias = model.lm_head.bias  # [V] or None
    if isinstance(bias, DTensor):  # FSDP2 resharded the root after a no-grad forward: gather it
        bias = bias.full_tensor()
    hidden = hidden.reshape(-1, hidden.shape[-1])  # [B*L, E]
    if rows is not None:
        hidden, flat = hidden.index_select(0, rows), flat.index_select(0, rows)
    loss_sum = fused_linear_cross_entropy(hidden, weight, flat, bias, ignore_index=IGNORE_INDEX)
    return loss_sum, (labels != IGNORE_INDEX).sum(), {}
