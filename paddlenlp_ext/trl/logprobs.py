"""Per-pair log-probabilities from packed preference batches, without materializing ``[tokens, vocab]`` fp32.

Only positions that carry a target (``chosen_labels`` or ``rejected_labels`` != -100) go through the LM head,
``chunk_size`` tokens at a time; each chunk runs under activation checkpointing, so the backward pass recomputes
one ``[chunk, vocab]`` block at a time instead of keeping all of them. The log-softmax is in fp32.

Source: PaddleNLP ``DPOCriterion.dpo_logps`` (``paddlenlp/transformers/dpo_criterion.py``), whose "sparse head"
variant also gathers the labelled positions first. Unlike PaddleNLP (``ignore_eos_token=True``), every target
token of both responses is summed (see ``dpo_criterion`` for the list of differences).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from paddlenlp_ext.trl.dpo_criterion import PairLogps

IGNORE_INDEX = -100


def _chunk_logps_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()  # [C, V]; matmul in the model dtype, softmax in fp32
    return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)  # [C]


def _chunk_logps_from_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logits.float().log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


def token_logps(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int = 1024
) -> torch.Tensor:
    """log p(target) for each token from final hidden states and the LM-head weight, chunked over tokens.

    Args:
        hidden: ``[T, H]`` final hidden states (any float dtype).
        weight: ``[V, H]`` LM-head weight (``model.lm_head.weight``; tied or not).
        targets: int64 ``[T]`` target ids in ``[0, V)``.
        chunk_size: tokens per chunk; peak extra memory is about ``2 * chunk_size * V * 4`` bytes.

    Returns:
        float32 ``[T]``; differentiable w.r.t. ``hidden`` and ``weight`` (the backward pass recomputes each
        chunk's logits, so no ``[T, V]`` tensor is ever kept).

    Raises:
        ValueError: shape mismatch or a target outside ``[0, V)``.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be [T, H] and weight [V, H]; got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [T] = [{hidden.shape[0]}], got {tuple(targets.shape)}")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= weight.shape[0]):
        raise ValueError(f"target ids must be in [0, {weight.shape[0]}); got range [{int(targets.min())}, {int(targets.max())}]")
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    out = []
    for s in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[s : s + chunk_size], targets[s : s + chunk_size]
        if grad:
            out.append(checkpoint(_chunk_logps_from_hidden, h, weight, t, use_reentrant=False))
        else:
            out.append(_chunk_logps_from_hidden(h, weight, t))
    # no target (a micro-batch whose pairs all fall past a progressive-length cut): an empty result that is still
    # part of the graph, so the backward reaches every parameter (FSDP ranks stay in step)
    return torch.cat(out) if out else _chunk_logps_from_hidden(hidden, weight, targets)


def token_logps_from_logits(logits: torch.Tensor, targets: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Same as ``token_logps`` for a model that only returns logits ``[T, V]``: fp32 log-softmax in chunks."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits must be [T, V] and targets [T]; got {tuple(logits.shape)} and {tuple(targets.shape)}")
    grad = torch.is_grad_enabled() and logits.requires_grad
    out = []
    for s in range(0, logits.shape[0], chunk_size):
        x, t = logits[s : s + chunk_size], targets[s : s + chunk_size]
        out.append(checkpoint(_chunk_logps_from_logits, x, t, use_reentrant=False) if grad else _chunk_logps_from_logits(x, t))
    return torch.cat(out) if out else _chunk_logps_from_logits(logits, targets)


def response_segments(response_indexs: torch.Tensor, batch_size: int, seq_len: int) -> torch.Tensor:
    """Map each pack position to its response: ``2k`` = chosen of pair k, ``2k+1`` = rejected, ``-1`` = neither.

    Args:
        response_indexs: int64 ``[N, 4]`` rows ``[batch_row, chosen_start, rejected_start, end]`` (design.md).

    Returns:
        int64 ``[B, L]``.

    Raises:
        ValueError: wrong shape, an index out of range, unordered spans or overlapping pairs.
    """
    if response_indexs.dim() != 2 or response_indexs.shape[1] != 4:
        raise ValueError(f"response_indexs must be int64 [N_pairs, 4], got shape {tuple(response_indexs.shape)}")
    seg = torch.full((batch_size, seq_len), -1, dtype=torch.long)
    for k, (b, cs, rs, e) in enumerate(response_indexs.tolist()):
        if not (0 <= b < batch_size and 0 <= cs < rs < e <= seq_len):
            raise ValueError(
                f"response_indexs row {k} = {[b, cs, rs, e]} is invalid for a batch of shape [{batch_size}, {seq_len}]: "
                "need 0 <= batch_row < B and 0 <= chosen_start < rejected_start < end <= L"
            )
        if (seg[b, cs:e] != -1).any():
            raise ValueError(f"response_indexs row {k} = {[b, cs, rs, e]} overlaps an earlier pair")
        seg[b, cs:rs] = 2 * k
        seg[b, rs:e] = 2 * k + 1
    return seg.to(response_indexs.device)


def _targets(batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Flat positions, targets and segment ids of every labelled token of the batch."""
    cl, rl, ri = batch["chosen_labels"], batch["rejected_labels"], batch["response_indexs"]
    if cl.shape != rl.shape or cl.dim() != 2:
        raise ValueError(f"chosen_labels and rejected_labels must both be [B, L]; got {tuple(cl.shape)}, {tuple(rl.shape)}")
    has_c, has_r = cl != IGNORE_INDEX, rl != IGNORE_INDEX
    if (has_c & has_r).any():
        raise ValueError("chosen_labels and rejected_labels both have a target at the same position")
    seg = response_segments(ri, *cl.shape)
    # Each target must lie in its own pair's span of the right kind (even = chosen, odd = rejected).
    if ((seg < 0) & (has_c | has_r)).any() or (has_c & (seg % 2 != 0)).any() or (has_r & (seg % 2 != 1)).any():
        raise ValueError("a chosen/rejected label lies outside its [chosen_start, rejected_start) / "
                         "[rejected_start, end) span in response_indexs")
    mask = (has_c | has_r).flatten()
    pos = mask.nonzero().squeeze(-1)  # [T]
    targets = torch.where(has_c, cl, rl).flatten()[pos]
    return pos, targets, seg.flatten()[pos], ri.shape[0]


def _sum_pairs(logps: torch.Tensor, seg: torch.Tensor, num_pairs: int) -> PairLogps:
    sums = torch.zeros(2 * num_pairs, dtype=torch.float32, device=logps.device).index_add(0, seg, logps)
    counts = torch.zeros(2 * num_pairs, dtype=torch.long, device=logps.device).index_add(0, seg, torch.ones_like(seg))
    if (counts == 0).any():
        raise ValueError("a response in response_indexs has no target tokens in chosen_labels/rejected_labels")
    return PairLogps(sums[0::2], sums[1::2], counts[0::2], counts[1::2])


def pair_logps_from_hidden(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, batch: dict, chunk_size: int = 1024
) -> PairLogps:
    """Per-pair sums of log p(response tokens) from final hidden states ``[B, L, H]`` of a preference pack.

    ``batch`` holds ``chosen_labels``, ``rejected_labels`` (int64 ``[B, L]``, -100 = ignore) and
    ``response_indexs`` (int64 ``[N, 4]``). Returns ``PairLogps`` (float32 sums, int64 token counts, ``[N]``).
    """
    pos, targets, seg, n = _targets(batch)
    h = hidden.reshape(-1, hidden.shape[-1])[pos]  # [T, H]
    return _sum_pairs(token_logps(h, lm_head_weight, targets.to(h.device), chunk_size), seg.to(h.device), n)


def pair_logps_from_logits(logits: torch.Tensor, batch: dict, chunk_size: int = 1024) -> PairLogps:
    """As ``pair_logps_from_hidden`` for logits ``[B, L, V]`` (models that do not expose hidden states)."""
    pos, targets, seg, n = _targets(batch)
    x = logits.reshape(-1, logits.shape[-1])[pos]  # [T, V]
    return _sum_pairs(token_logps_from_logits(x, targets.to(x.device), chunk_size), seg.to(x.device), n)
