"""Dense view of FlashMask's column-wise mask (shared by the reference and the mask builders).

Shape legend: B batch, H_mask mask heads (1 or H_k), S_q query rows, S_k key columns,
C vectors per column (1, 2 or 4).

Semantics (FlashMask, Wang et al., ICLR 2025; Paddle ``flashmask_attention``):
key column ``j`` is masked for query rows in ``[LTS_j, LTE_j)`` and ``[UTS_j, UTE_j)``.
Absent vectors take these defaults:

=============  =====  =====  =====  ==========
mode           LTS    LTE    UTS    UTE
=============  =====  =====  =====  ==========
causal, C=1    given  S_q    0      j (causal)
causal, C=2    given  given  0      j (causal)
full,   C=2    given  S_q    0      given
full,   C=4    given  given  given  given
=============  =====  =====  =====  ==========
"""

from __future__ import annotations

import torch


def expand_startend(startend_row_indices: torch.Tensor, causal: bool, seq_q: int) -> tuple[torch.Tensor, ...]:
    """Return ``(LTS, LTE, UTS, UTE)``, each int64 ``[B, H_mask, S_k]``, with the defaults filled in.

    Args:
        startend_row_indices: int ``[B, H_mask, S_k, C]``; C in {1, 2} when causal, {2, 4} otherwise.
        causal: whether the implicit causal interval ``[0, j)`` is part of the mask.
        seq_q: number of query rows S_q (the default end of the lower interval).

    Raises:
        ValueError: if C does not fit the mode.
    """
    sri = startend_row_indices.long()
    b, h, s_k, c = sri.shape
    allowed = (1, 2) if causal else (2, 4)
    if c not in allowed:
        raise ValueError(
            f"startend_row_indices last dim must be one of {allowed} when causal={causal}, got shape {tuple(sri.shape)}"
        )
    j = torch.arange(s_k, device=sri.device).expand(b, h, s_k)
    full_q = torch.full_like(sri[..., 0], seq_q)
    zeros = torch.zeros_like(sri[..., 0])
    lts = sri[..., 0]
    if causal:
        lte = sri[..., 1] if c == 2 else full_q
        return lts, lte, zeros, j
    if c == 2:
        return lts, full_q, zeros, sri[..., 1]
    return lts, sri[..., 1], sri[..., 2], sri[..., 3]


def to_dense(startend_row_indices: torch.Tensor | None, causal: bool = True, seq_q: int | None = None,
             seq_k: int | None = None) -> torch.Tensor:
    """Materialise the allowed-attention mask, bool ``[B, H_mask, S_q, S_k]`` (True = query row may attend).

    Args:
        startend_row_indices: int32 ``[B, H_mask, S_k, C]`` or None (plain causal / full attention; then
            ``seq_q`` and ``seq_k`` are required and the result is ``[1, 1, S_q, S_k]``).
        causal: FlashMask causal mode (adds the implicit mask ``i < j``).
        seq_q: number of query rows; defaults to S_k.

    A :class:`flashmask.masks.FlashMask` may be passed as the first argument: its indices and its own causal
    flag are used (``causal`` is then ignored).

    This is O(S_q * S_k) memory: it exists for tests, plots and the reference, never for the kernel.
    """
    if hasattr(startend_row_indices, "startend_row_indices") and hasattr(startend_row_indices, "causal"):
        startend_row_indices, causal = startend_row_indices.startend_row_indices, startend_row_indices.causal
    if startend_row_indices is None:
        if seq_q is None or seq_k is None:
            raise ValueError("to_dense(None, ...) needs seq_q and seq_k")
        i = torch.arange(seq_q)[:, None]
        j = torch.arange(seq_k)[None, :]
        allowed = (j <= i) if causal else torch.ones(seq_q, seq_k, dtype=torch.bool)
        return allowed[None, None]
    s_k = startend_row_indices.shape[2]
    seq_q = s_k if seq_q is None else seq_q
    lts, lte, uts, ute = expand_startend(startend_row_indices, causal, seq_q)
    i = torch.arange(seq_q, device=startend_row_indices.device)[None, None, :, None]
    masked = ((i >= lts[:, :, None, :]) & (i < lte[:, :, None, :])) | (
        (i >= uts[:, :, None, :]) & (i < ute[:, :, None, :])
    )
    return ~masked
