"""Batched generation of prompts of different lengths (left padding), with repetition penalty and a KV cache.

Source: PaddleNLP ``GenerationMixin.generate`` as ERNIE-3.5-SE's ``predict_generation.py`` calls it (left-padded
batches, ``decode_strategy`` greedy or sampling with ``temperature`` / ``top_k`` / ``top_p``,
``repetition_penalty``) and its ``pos_decoding_interval``. Differences: padding is masked out of attention (a
FlashMask key mask; PaddleNLP's ERNIE flash path ignores the mask, so padded rows see the padding) and positions
restart at 0 on each row's first real token, so a prompt decodes the same alone or in a batch.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from .generation import _filter_logits

__all__ = ["generate_batch", "apply_repetition_penalty", "pos_decoding_interval", "ERNIE_SAMPLING"]

# PaddleNLP's ERNIE-3.5-SE predictor defaults when sampling (predict_generation.py)
ERNIE_SAMPLING = {"temperature": 0.95, "top_k": 3, "top_p": 0.8}


def pos_decoding_interval(max_position_embeddings: int, src_length: int, tgt_length: int,
                          given: int | None = None) -> int:
    """ERNIE-3.5-SE's spacing of inference positions: ``given`` (the flag), else the ``pos_decoding_interval``
    environment variable, else PaddleNLP predictor's rule: 8 when ``src_length + tgt_length <= 4096``, else
    ``max(max_position_embeddings // (src_length + tgt_length), 1)``.

    Raises:
        ValueError: a value below 1, or an environment value that is not an integer.
    """
    if given is None and os.environ.get("pos_decoding_interval"):
        raw = os.environ["pos_decoding_interval"]
        try:
            given = int(raw)
        except ValueError:
            raise ValueError(f"environment variable pos_decoding_interval={raw!r}: expected an integer >= 1") from None
    if given is not None:
        if given < 1:
            raise ValueError(f"pos_decoding_interval must be >= 1, got {given}")
        return int(given)
    total = src_length + tgt_length
    return 8 if total <= 4096 else max(max_position_embeddings // total, 1)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL / PaddleNLP / Hugging Face repetition penalty: for every token id in ``seen`` (bool ``[B, V]``), a
    positive logit is divided by ``penalty``, a negative one multiplied. ``logits`` fp32 ``[B, V]``."""
    if penalty == 1.0:
        return logits
    scored = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, scored, logits)


def _key_mask(real: torch.Tensor, causal: bool) -> torch.Tensor:
    """FlashMask vectors int32 ``[B, 1, S, C]`` that hide the padding key columns (``real`` bool ``[B, S]``):
    causal (C = 1): LTS = S on real columns, 0 on padding; one query after a cache (C = 2, LTS/UTE): LTS = 1 on
    real columns (no row of the single query masked), 0 on padding."""
    s = real.shape[1]
    lts = torch.where(real, s if causal else 1, 0).to(torch.int32)[:, None, :, None]
    return lts if causal else torch.cat([lts, torch.zeros_like(lts)], dim=-1)


@torch.no_grad()
def generate_batch(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, pad_token_id: int,
                   eos_token_id: int | Sequence[int] | None = None, do_sample: bool = False, temperature: float = 1.0,
                   top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0, use_cache: bool = True,
                   generator: torch.Generator | None = None) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` tokens after each prompt, all prompts in one left-padded batch.

    Args:
        model: a causal LM taking ``(input_ids, position_ids, attn_mask_startend_row_indices, kv_cache=...)`` and
            returning logits ``[B, L, V]`` (our Llama and ERNIE-3.5-SE); the cache is used when it has
            ``make_kv_cache`` and ``use_cache`` (for a padded batch only when it declares ``kv_cache_key_mask``).
        prompts: token id lists (at least one token each).
        pad_token_id: the left padding id (masked out of attention; its rows are never read).
        eos_token_id: id(s) that end a row (kept in its output).
        repetition_penalty: > 0; 1 = off (PaddleNLP's default), > 1 discourages tokens already in the row.

    Returns:
        one list of new token ids per prompt (the prompt excluded; stops after an end token).

    Raises:
        ValueError: an empty prompt, ``repetition_penalty <= 0``, or bad sampling parameters.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate_batch needs non-empty prompts")
    if repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {repetition_penalty}")
    if do_sample and (temperature <= 0 or not 0.0 <= top_p <= 1.0 or top_k < 0):
        raise ValueError(f"sampling needs temperature > 0, 0 <= top_p <= 1, top_k >= 0; got {temperature}, "
                         f"{top_p}, {top_k}")
    device = next(model.parameters()).device
    bsz, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((bsz, width), pad_token_id, dtype=torch.long, device=device)
    real = torch.zeros((bsz, width), dtype=torch.bool, device=device)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long, device=device)
        real[b, width - len(p):] = True
    lengths = real.sum(1)  # [B]
    pos = (torch.arange(width, device=device)[None] - (width - lengths)[:, None]).clamp(min=0)  # 0 at the 1st real
    eos = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or []),
                       dtype=torch.long, device=device)
    vocab = None
    seen = None
    padded = not bool(real.all())
    # a padded batch decodes against the cache with a key-column mask, which the model must accept (ERNIE-3.5-SE
    # declares it); other models decode padded batches without the cache
    if use_cache and hasattr(model, "make_kv_cache") and (not padded or getattr(model, "kv_cache_key_mask", False)):
        cache = model.make_kv_cache(bsz, width + max_new_tokens)
    else:
        cache = None
    was_training = model.training
    model.eval()
    out = [[] for _ in range(bsz)]
    done = torch.zeros(bsz, dtype=torch.bool, device=device)
    step_ids, step_pos = ids, pos
    try:
        for t in range(max_new_tokens):
            if cache is not None:
                mask = _key_mask(real, causal=cache.seen == 0) if padded else None
                logits = model(step_ids, position_ids=step_pos, attn_mask_startend_row_indices=mask, kv_cache=cache)
            else:
                logits = model(ids, position_ids=pos,
                               attn_mask_startend_row_indices=_key_mask(real, causal=True) if padded else None)
            logits = logits[:, -1].float()  # [B, V]
            if vocab is None:
                vocab = logits.shape[-1]
                seen = torch.zeros((bsz, vocab), dtype=torch.bool, device=device)
                seen.scatter_(1, ids.clamp(max=vocab - 1), real)  # the prompt's real tokens
            logits = apply_repetition_penalty(logits, seen, repetition_penalty)
            if do_sample:
                probs = _filter_logits(logits / temperature, top_k, top_p).softmax(-1)
                nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, pad_token_id), nxt)  # [B]
            for b in (~done).nonzero().flatten().tolist():
                out[b].append(int(nxt[b]))
            seen[torch.arange(bsz, device=device), nxt] |= ~done
            new_pos = pos[:, -1:] + 1
            ids, pos = torch.cat([ids, nxt[:, None]], 1), torch.cat([pos, new_pos], 1)
            real = torch.cat([real, torch.ones((bsz, 1), dtype=torch.bool, device=device)], 1)
            step_ids, step_pos = nxt[:, None], new_pos
            done |= torch.isin(nxt, eos)
            if bool(done.all()):
                break
    finally:
        model.train(was_training)
    return out
