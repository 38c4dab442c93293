"""ERNIE-3.5-SE positions: RoPE, random sorted position ids, the inference interval, progressive length warm-up.

Source: PaddleNLP ``llm/experimental/ernie-3.5-se/modeling.py`` (``RotaryEmbedding``, ``progressive_seq`` in
``Ernie35ForCausalLM.forward``) and ``predict_generation.py`` (``pos_decoding_interval``).

PaddleNLP applies the random/interval scheme only when ``position_ids`` is None; packed batches always carry
``position_ids`` (restarting at 0 per example), so here the scheme is applied *per example* of a pack: each
segment that starts at position 0 gets its own table ``T`` (training: ``n`` sorted distinct draws from
``[0, max_pos)`` by a ``numpy.random.default_rng(seed)``; eval: ``times * (i + 1) - 1``) and token position ``p``
becomes ``T[p]``. A DPO pack's prompt/chosen/rejected
share one segment (their positions continue from the prompt), so chosen and rejected tokens at the same logical
position get the same physical position. Without ``position_ids`` the whole row is one segment and the result is
PaddleNLP's, draw for draw (one draw shared by all rows).
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["rope_cos_sin", "apply_rotary_pos_emb", "resolve_position_ids", "progressive_seq_len", "position_seed",
           "training_seq_len"]

ROPE_BASE = 10000.0  # fixed in PaddleNLP's RotaryEmbedding


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for ``position_ids`` int64 ``[B, L]``: fp32 ``[B, L, 1, head_dim]`` each.

    ``inv_freq = 1 / 10000^(2i/d)``, ``emb = concat(freqs, freqs)`` (rotate-half layout), all in fp32 as in
    PaddleNLP's cached tables (computed on the fly here, so positions beyond ``max_position_embeddings`` work).
    """
    dev = position_ids.device
    inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, head_dim, 2, device=dev, dtype=torch.float32) / head_dim))
    freqs = position_ids.to(torch.float32)[..., None] * inv_freq  # [B, L, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, :, None, :]  # [B, L, 1, D]
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``q * cos + rotate_half(q) * sin`` for q, k ``[B, L, H, D]``; cos/sin cast to q's dtype first (PaddleNLP)."""
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def position_seed(global_step: int | None, replica_rank: int) -> int:
    """PaddleNLP's seed ``TRAINER_GLOBAL_STEP + rank * 100000``; ``global_step=None`` reads the environment.

    ``replica_rank`` is the data-parallel replica index (PaddleNLP uses the global rank, which makes TP ranks of
    one replica disagree; callers here pass the replica index so all shards of a replica draw the same ids).
    """
    if global_step is None:
        global_step = int(os.environ.get("TRAINER_GLOBAL_STEP", "0"))
    return int(global_step) + int(replica_rank) * 100000


def _interval_table(n: int, max_pos: int, interval: int | None = None) -> np.ndarray:
    times = interval or (8 if n <= 4096 else max(max_pos // n, 1))
    return times * (np.arange(n, dtype=np.int64) + 1) - 1


def _random_table(rng, n: int, max_pos: int) -> np.ndarray:
    """``n`` sorted distinct positions from ``[0, max_pos)``. ``RandomState``: PaddleNLP's exact draw
    (``sort(permutation(max_pos)[:n])``); ``Generator`` (packed path): ``choice`` without replacement, which does
    not shuffle all ``max_pos`` ids per segment (padding tokens are one-token segments)."""
    if n > max_pos:
        raise ValueError(f"ERNIE random position ids: a sequence of {n} positions exceeds "
                         f"max_position_embeddings={max_pos}; raise max_position_embeddings or shorten max_length")
    if isinstance(rng, np.random.RandomState):
        return np.sort(rng.permutation(max_pos)[:n]).astype(np.int64)
    return np.sort(rng.choice(max_pos, size=n, replace=False)).astype(np.int64)


def resolve_position_ids(position_ids: torch.Tensor | None, batch: int, seq_len: int, *, max_pos: int,
                         random_ids: bool, training: bool, seed: int, device,
                         interval: int | None = None) -> torch.Tensor:
    """Physical position ids int64 ``[batch, seq_len]`` fed to RoPE.

    Args:
        position_ids: int64 ``[B, L]`` logical positions (restarting at 0 per packed example) or None.
        max_pos: ``max_position_embeddings``.
        random_ids: ``enable_random_position_ids``; when False, ``position_ids`` (or ``arange``) is returned.
        training: random sorted draws (True) or the inference interval (False).
        seed: numpy ``RandomState`` seed (see :func:`position_seed`).
        interval: inference only: a fixed spacing ``I`` (logical position ``p`` -> ``I * (p + 1) - 1``, PaddleNLP
            predictor's ``pos_decoding_interval``) instead of the evaluation table's 8 (``max_pos // n`` past 4096).

    Raises:
        ValueError: a training segment longer than ``max_pos``, or ``position_ids`` of the wrong shape.
    """
    if position_ids is None:
        if not random_ids:
            return torch.arange(seq_len, device=device).expand(batch, seq_len)
        table = (_random_table(np.random.RandomState(seed), seq_len, max_pos) if training
                 else _interval_table(seq_len, max_pos, interval))
        return torch.from_numpy(table).to(device).expand(batch, seq_len)
    if tuple(position_ids.shape) != (batch, seq_len):
        raise ValueError(f"position_ids must be [batch={batch}, seq_len={seq_len}], got {list(position_ids.shape)}")
    if not random_ids:
        return position_ids
    rows = position_ids.detach().cpu().numpy()
    out = np.empty_like(rows, dtype=np.int64)
    rng = np.random.default_rng(seed)
    for b, row in enumerate(rows):
        starts = np.flatnonzero(row == 0)
        if starts.size == 0 or starts[0] != 0:
            starts = np.concatenate([[0], starts])
        bounds = np.concatenate([starts, [seq_len]])
        for s, e in zip(bounds[:-1], bounds[1:]):
            seg = row[s:e]
            n = int(seg.max()) + 1
            table = _random_table(rng, n, max_pos) if training else _interval_table(n, max_pos, interval)
            out[b, s:e] = table[seg]
    return torch.from_numpy(out).to(position_ids.device)


def progressive_seq_len(global_step: int | None) -> int | None:
    """Sequence-length warm-up: 512 tokens before step 500, 1024 before 1000, 2048 before 1500, then all (None).

    ``global_step=None`` reads ``TRAINER_GLOBAL_STEP`` (PaddleNLP ``progressive_seq``).
    """
    if global_step is None:
        global_step = int(os.environ.get("TRAINER_GLOBAL_STEP", "0"))
    for limit, length in ((500, 512), (1000, 1024), (1500, 2048)):
        if global_step < limit:
            return length
    return None


def training_seq_len(config, training: bool, global_step: int | None, seq_len: int) -> int:
    """Tokens a forward keeps of a ``seq_len``-long batch: the :func:`progressive_seq_len` cut when
    ``config.use_progressive_seq_len`` and ``training``, else ``seq_len``."""
    if getattr(config, "use_progressive_seq_len", False) and training:
        cut = progressive_seq_len(global_step)
        if cut is not None:
            return min(seq_len, cut)
    return seq_len
