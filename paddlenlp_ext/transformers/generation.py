"""Autoregressive decoding for our causal LMs: greedy, temperature / top-k / top-p sampling, with a KV cache.

A small counterpart of ``paddlenlp/generation/utils.py`` (``GenerationMixin.generate``) for batch-1 chat and
evaluation: prompts in one batch must have equal length (no left padding).
"""

from __future__ import annotations

from typing import Sequence

import torch


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf; ``logits [B, V]`` fp32."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest prefix whose mass reaches top_p
        drop[:, 0] = False  # the most likely token always stays: top_p = 0 is greedy (HF's min_tokens_to_keep=1)
        logits = logits.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    return logits


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int = 64, *, do_sample: bool = False,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, eos_token_id: int | list | None = None,
             pad_token_id: int | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Extend ``input_ids`` by up to ``max_new_tokens`` tokens.

    Args:
        model: a causal LM whose ``forward(input_ids, position_ids=None, ..., kv_cache=None)`` returns logits
            ``[B, L, V]``; the cache is used when the model has ``make_kv_cache``.
        input_ids: int64 ``[B, L]`` prompts of equal length.
        do_sample: sample from ``softmax(logits / temperature)`` filtered by ``top_k`` / ``top_p``; else greedy.
        eos_token_id: id or ids that end a row; later positions of that row are ``pad_token_id`` (default: eos).
        use_cache: keep a :class:`~paddlenlp_ext.transformers.cache.KVCache` (O(L) per token instead of O(L^2)).
        generator: RNG for sampling.

    Returns:
        int64 ``[B, L + n]`` with ``n <= max_new_tokens`` (stops early when every row has ended).

    Raises:
        ValueError: bad ``input_ids`` shape or sampling parameters.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq], got {list(input_ids.shape)}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if do_sample and not (0.0 <= top_p <= 1.0 and top_k >= 0):
        # refused rather than read as "no filter": top_p=0 would otherwise sample the full distribution
        raise ValueError(f"sampling needs 0 <= top_p <= 1 (1 = no nucleus filter, 0 = the top token only) and "
                         f"top_k >= 0 (0 = no top-k filter); got top_p={top_p}, top_k={top_k}")
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    eos_t = torch.tensor(eos, dtype=torch.long, device=input_ids.device)
    cache = model.make_kv_cache(input_ids.shape[0], input_ids.shape[1] + max_new_tokens) \
        if use_cache and hasattr(model, "make_kv_cache") else None
    was_training = model.training
    model.eval()
    out = input_ids
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    step_ids = input_ids
    try:
        for _ in range(max_new_tokens):
            logits = model(step_ids, kv_cache=cache) if cache is not None else model(out)
            logits = logits[:, -1].float()  # [B, V]
            if do_sample:
                probs = _filter_logits(logits / temperature, top_k, top_p).softmax(-1)
                nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)  # [B]
            out = torch.cat([out, nxt[:, None]], dim=1)
            step_ids = nxt[:, None]
            done |= torch.isin(nxt, eos_t)
            if bool(done.all()):
                break
    finally:
        model.train(was_training)
    return out


def encode_conversation(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Prompt token ids of ``messages`` (ending with a user message), ready for the reply to be generated.

    With a chat template: ``apply_chat_template(messages, add_generation_prompt=True)``. Without one: plain
    concatenation in the no-template SFT layout (``paddlenlp_ext.datasets.sft``), ``[bos] user_i`` +
    ``reply_i [eos]`` per finished turn and ``[bos] user`` last (no bos/eos when the tokenizer has none); a system
    message, which that layout has no slot for, is prepended as text to the first user message. Returns a list of
    int token ids. Used by :func:`chat` and ``llm/predict.py`` (PaddleNLP ``BasePredictor._preprocess``).
    """
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, return_dict=True)
        return list(enc["input_ids"])
    bos, eos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
    ids: list[int] = []
    for m in messages:
        if m["role"] == "user":
            text = f"{system}\n{m['content']}" if system is not None else m["content"]
            system = None
            ids += ([bos] if bos is not None else []) + list(tokenizer.encode(text, add_special_tokens=False))
        elif m["role"] == "assistant":
            ids += list(tokenizer.encode(m["content"], add_special_tokens=False)) + ([eos] if eos is not None else [])
    return ids


def chat(model, tokenizer, messages, max_new_tokens: int = 128, **generate_kwargs) -> str:
    """Answer a conversation with the tokenizer's chat template, or without one in the no-template SFT layout
    (:func:`encode_conversation`, as ``llm/predict.py``); returns the decoded reply (special tokens dropped).

    Args:
        messages: ``[{"role": "user"|"assistant"|"system", "content": str}, ...]`` or one user string.
        generate_kwargs: passed to :func:`generate` (``do_sample``, ``top_p``, ...).
    """
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    device = next(model.parameters()).device
    ids = torch.tensor([encode_conversation(tokenizer, messages)], dtype=torch.long, device=device)  # [1, L]
    generate_kwargs.setdefault("eos_token_id", tokenizer.eos_token_id)
    generate_kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
    out = generate(model, ids, max_new_tokens, **generate_kwargs)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
