"""Pure-PyTorch FlashMask attention: the readable oracle every kernel is tested against.

Shape legend: B batch, S_q / S_k query / key length, H_q / H_k query / key-value heads,
H_mask mask heads (1 or H_k), D head dim.

It materialises the dense mask (O(S_q * S_k)), computes scores in fp32 (or in the input dtype when
``compute_dtype`` says so, which tests use to derive tolerances), and supports autograd.
Rows that may attend to nothing return 0 output, -inf LSE, and zero (finite) gradients.
"""

from __future__ import annotations

import torch

from .dense import to_dense


def flashmask_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    startend_row_indices: torch.Tensor | None,
    causal: bool,
    softmax_scale: float,
    compute_dtype: torch.dtype | None = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention, returns ``(out [B, S_q, H_q, D] in query.dtype, lse [B, H_q, S_q] fp32)``.

    Args:
        query: ``[B, S_q, H_q, D]``; key, value: ``[B, S_k, H_k, D]``; ``H_q % H_k == 0``.
        startend_row_indices: int32 ``[B, H_mask, S_k, C]`` or None; semantics in :mod:`flashmask.dense`.
        causal: FlashMask causal mode.
        softmax_scale: multiplier of ``q @ k^T`` (usually ``D ** -0.5``).
        compute_dtype: dtype of the score/softmax/PV math; None keeps the input dtype.

    Inputs are assumed validated by :func:`flashmask.flashmask_attention`.
    """
    b, s_q, h_q, _ = query.shape
    s_k, h_k = key.shape[1], key.shape[2]
    dt = query.dtype if compute_dtype is None else compute_dtype
    q = query.transpose(1, 2).to(dt)  # [B, H_q, S_q, D]
    k = key.transpose(1, 2).to(dt).repeat_interleave(h_q // h_k, dim=1)  # [B, H_q, S_k, D]
    v = value.transpose(1, 2).to(dt).repeat_interleave(h_q // h_k, dim=1)

    allowed = to_dense(startend_row_indices, causal, seq_q=s_q, seq_k=s_k).to(query.device)
    allowed = allowed.repeat_interleave(h_q // allowed.shape[1], dim=1)  # [B|1, H_q, S_q, S_k]
    row_live = allowed.any(dim=-1, keepdim=True)  # [B|1, H_q, S_q, 1]

    scores = (q @ k.transpose(-1, -2)) * softmax_scale  # [B, H_q, S_q, S_k]
    scores = scores.masked_fill(~allowed, float("-inf"))
    # An empty row would give softmax(all -inf) = NaN; give it finite scores, then zero its weights.
    scores = torch.where(row_live, scores, torch.zeros_like(scores))
    lse = torch.logsumexp(scores.float(), dim=-1)  # [B, H_q, S_q]
    probs = torch.softmax(scores, dim=-1) * row_live
    out = probs @ v  # [B, H_q, S_q, D]
    lse = lse.masked_fill(~row_live[..., 0], float("-inf"))
    return out.transpose(1, 2).to(query.dtype), lse.expand(b, h_q, s_q).contiguous()
