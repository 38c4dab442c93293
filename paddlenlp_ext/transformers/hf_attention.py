"""FlashMask as a ``transformers`` attention backend: ``attn_implementation="FlashMask"``.

``register_flashmask_attention()`` (run on import of this module) registers

- ``transformers.AttentionInterface["FlashMask"]`` = :func:`flashmask_attention_forward`: every layer of a model
  whose attention calls ``ALL_ATTENTION_FUNCTIONS.get_interface(...)`` (Llama, Qwen2/3, Mistral, Gemma 3, Phi-3,
  ...) runs :func:`flashmask.flashmask_attention` on ``[B, S, H, D]`` views of its q/k/v;
- ``transformers.AttentionMaskInterface["FlashMask"]`` = :func:`flashmask_padding_mask`: passes a 2-D padding
  mask through (O(S)) and builds nothing else, so no ``[B, 1, S, S]`` mask ever exists.

Where the mask comes from, most explicit first (once per forward, no host sync):

1. ``attn_mask_startend_row_indices`` (forward kwarg; our packed-batch contract, int32 ``[B, 1|H_k, S, C]``);
2. ``cu_seq_lens_q`` (``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``, batch 1);
3. ``position_ids`` that restart per example (``DataCollatorWithFlattening``, TRL ``padding_free=True``): a new
   document starts wherever the position does not step by +1 (``transformers``' ``find_packed_sequence_indices``
   rule);
4. none of these: plain causal attention.

A 2-D ``attention_mask`` (1 = token, 0 = padding) is folded in: padding columns are masked for every row.
Sliding-window layers get the window folded into the same vectors exactly (column j is masked from row
``min(LTS_j, j + W)``, ``transformers``' ``kv_idx > q_idx - W``). Generation with a KV cache (``S_q != S_k``)
runs ``torch.nn.functional.scaled_dot_product_attention`` on an O(S_q x S_k) mask instead.

Refused with one ``ValueError`` naming the model, the config key and ``attn_implementation="sdpa"``: attention
logit softcapping, learned sinks, dropout in training, ALiBi / position biases, chunked attention, a 4-D mask.
"""

from __future__ import annotations

import torch

from flashmask import flashmask_attention

# transformers treats every attn_implementation whose name contains "flash" (lower case) as a FlashAttention kernel
# to import (``is_flash_attention_requested``), so the name is spelled "FlashMask".
FLASHMASK = "FlashMask"
STARTEND_KEY = "attn_mask_startend_row_indices"


class FlashMaskUnsupportedError(ValueError):
    """A model feature the FlashMask kernel cannot compute exactly (softcapping, sinks, ALiBi, ...)."""


def _model_name(module) -> str:
    config = getattr(module, "config", None)
    archs = getattr(config, "architectures", None) or []
    return archs[0] if archs else f"model_type {getattr(config, 'model_type', type(module).__name__)!r}"



def _refuse(module, what: str, key: str) -> None:
    raise FlashMaskUnsupportedError(
        f"{_model_name(module)}: {what} ({key}) cannot be computed exactly by attn_implementation="
        f"{FLASHMASK!r}; load the model with attn_implementation='sdpa' (or 'eager') and train on padded batches "
        f"instead")


def _starts_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """bool ``[B, S]``: True where a document starts (position does not step by +1; column 0 always)."""
    first = torch.ones_like(position_ids[:, :1], dtype=torch.bool)
    return torch.cat([first, position_ids[:, 1:] - position_ids[:, :-1] != 1], dim=1)


def _starts_from_cu_seqlens(cu_seqlens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """bool ``[1, S]`` from cumulative lengths ``[n + 1]`` (FlashAttention varlen layout, one flattened row)."""
    starts = torch.zeros(1, seq_len + 1, dtype=torch.bool, device=cu_seqlens.device)
    starts[0, cu_seqlens.long().clamp(max=seq_len)] = True
    starts[0, 0] = True
    return starts[:, :seq_len]


def startend_from_starts(starts: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """FlashMask vectors of a document mask from its start flags, int32 ``[B, 1, S, C]``.

    ``starts`` bool ``[B, S]`` (True on each document's first token). Causal: C=1, ``LTS_j`` = the end (exclusive)
    of j's document. Bidirectional: C=2 ``[LTS_j, UTE_j]`` with ``UTE_j`` = the start of j's document. Elementwise
    and cumulative ops only (no host sync, no data-dependent shapes).
    """
    b, s = starts.shape
    idx = torch.arange(s, device=starts.device).expand(b, s)
    big = torch.full_like(idx, s)
    start_pos = torch.where(starts, idx, big)  # [B, S]: j where a document starts, else S
    # first start strictly after j = min over k > j of start_pos[k]
    after = torch.cat([start_pos[:, 1:], big[:, :1]], dim=1)
    end = after.flip(-1).cummin(-1).values.flip(-1)
    if causal:
        return end.to(torch.int32)[:, None, :, None]
    begin = torch.where(starts, idx, torch.zeros_like(idx)).cummax(-1).values
    return torch.stack([end, begin], dim=-1).to(torch.int32)[:, None]


def _cached(owner: torch.Tensor, key, build):
    """``build()`` memoised on ``owner`` (keyed by ``key`` and ``owner._version``): the layers of one forward share
    one index tensor. Not under ``torch.compile`` (setting attributes would break the graph) nor for inference
    tensors (no version counter)."""
    if torch.compiler.is_compiling() or owner.is_inference():
        return build()
    store = getattr(owner, "_flashmask_cache", None)
    if store is None or store[0] != owner._version:
        store = (owner._version, {})
        owner._flashmask_cache = store
    if key not in store[1]:
        store[1][key] = build()
    return store[1][key]


def _document_startend(kwargs: dict, attention_mask, b: int, s: int, causal: bool, device) -> torch.Tensor | None:
    """The batch's FlashMask vectors from the most explicit source (module docstring), or None (plain causal)."""
    sri = kwargs.get(STARTEND_KEY)
    if sri is None:
        cu = kwargs.get("cu_seq_lens_q")
        pos = kwargs.get("position_ids")
        if cu is not None:
            cu_k = kwargs.get("cu_seq_lens_k")
            if cu_k is not None and cu_k is not cu and tuple(cu_k.shape) != tuple(cu.shape):
                raise ValueError(f"flashmask: cu_seq_lens_q {list(cu.shape)} and cu_seq_lens_k {list(cu_k.shape)} "
                                 "differ; self-attention on packed documents needs the same boundaries for both")
            if b != 1:
                raise ValueError(f"flashmask: cu_seq_lens_q describes one flattened row, got a batch of {b}; "
                                 "flatten the batch to [1, total] (DataCollatorWithFlattening) or pass position_ids")
            sri = _cached(cu, ("cu", s, causal), lambda: startend_from_starts(_starts_from_cu_seqlens(cu, s), causal))
        elif pos is not None and pos.dim() == 2 and pos.shape[-1] == s:
            pos = pos.expand(b, s) if pos.shape[0] != b else pos
            sri = _cached(pos, ("pos", causal), lambda: startend_from_starts(_starts_from_position_ids(pos), causal))
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError(
                f"flashmask: got a {attention_mask.dim()}-D attention_mask {list(attention_mask.shape)}; this backend "
                f"takes a 2-D padding mask [batch, seq] or none: pass packed documents as {STARTEND_KEY} or as "
                "position_ids that restart per document")
        pad = attention_mask[:, -s:].to(device=device, dtype=torch.bool)  # [B, S], True = token
        if sri is None:
            sri = startend_from_starts(torch.arange(s, device=device).eq(0).expand(b, s), causal)
        # padding columns: masked for every row (LTS = 0; a bidirectional UTE then does not matter)
        sri = torch.cat([torch.where(pad[:, None, :], sri[..., 0], 0)[..., None], sri[..., 1:]], dim=-1)
    return sri


def fold_sliding_window(sri: torch.Tensor | None, window: int, b: int, s: int, causal: bool,
                        device) -> torch.Tensor:
    """Compose a sliding window of ``window`` keys (``transformers``: query i sees keys ``(i - W, i]``) with the
    causal FlashMask vectors ``sri`` int32 ``[B, H, S, 1]`` (None = plain causal): ``LTS_j = min(LTS_j, j + W)``.

    Exact: C=1 masks rows ``[LTS_j, S)`` and the window masks rows ``[j + W, S)``, so their union is one interval.

    Raises:
        ValueError: a bidirectional layer (``causal=False``) or C != 1 vectors with a window: not one interval.
    """
    if not causal or (sri is not None and sri.shape[-1] != 1):
        raise ValueError(f"flashmask: a sliding window ({window}) can be folded only into causal [LTS] vectors "
                         f"(C=1); got causal={causal}, C={None if sri is None else sri.shape[-1]}")
    j = torch.arange(s, device=device, dtype=torch.int32)
    win = torch.clamp(j + window, max=s)[None, None, :, None]  # [1, 1, S, 1]
    if sri is None:
        return win.expand(b, 1, s, 1)
    return torch.minimum(sri, win)


def window_fold_exact(sri: torch.Tensor, position_ids: torch.Tensor, window: int) -> torch.Tensor:
    """bool ``[B]``: whether folding a window of ``window`` keys by column distance (:func:`fold_sliding_window`)
    equals the window by position distance that each example has alone.

    They differ only where a column is seen by rows whose positions do not continue its own (a share-question
    pack: the rejected answer's positions restart after the prompt, behind the chosen answer's columns) and that
    column's example spans more than ``window`` rows. Column j is checked as: ``LTS_j - j <= window``, or
    ``position - column`` is constant on rows ``[j, LTS_j)``. Device ops only; the caller reads the result.
    """
    lts = sri[:, 0, :, 0].long()  # [B, S]
    b, s = lts.shape
    pos = position_ids.expand(b, s) if position_ids.shape[0] != b else position_ids
    col = torch.arange(s, device=lts.device)
    off = pos - col  # constant along a run of continuing positions
    change = torch.cat([torch.zeros_like(off[:, :1], dtype=torch.bool), off[:, 1:] != off[:, :-1]], dim=1)
    start_pos = torch.where(change, col.expand(b, s), torch.full_like(lts, s))
    after = torch.cat([start_pos[:, 1:], torch.full_like(lts[:, :1], s)], dim=1)
    next_change = after.flip(-1).cummin(-1).values.flip(-1)  # first change strictly after j
    return ((lts - col <= window) | (next_change >= lts)).all(dim=1)


def _check_window_exact(module, sri: torch.Tensor, position_ids: torch.Tensor, window: int) -> None:
    """Raise when :func:`window_fold_exact` is False. One host read per batch and window (cached on ``sri``);
    skipped under ``torch.compile``."""
    if torch.compiler.is_compiling():
        return
    ok = _cached(sri, ("window_exact", window), lambda: bool(window_fold_exact(sri, position_ids, window).all()))
    if not ok:
        raise FlashMaskUnsupportedError(
            f"{_model_name(module)}: layer {getattr(module, 'layer_idx', '?')} attends over a sliding window of "
            f"{window} tokens, and a packed example whose rows do not continue each other's positions (a "
            f"share-question DPO / RM pair: prompt, chosen, rejected) is longer than that window; its window cannot "
            f"be folded into the FlashMask vectors exactly. Keep prompt + longest answer within {window} tokens "
            f"(max_seq_len), or train on unpacked pairs with attn_implementation='sdpa'")


def _check_supported(module, dropout: float, kwargs: dict) -> None:
    config = getattr(module, "config", None)
    if kwargs.get("softcap") is not None:
        _refuse(module, "attention logit softcapping", f"config key attn_logit_softcapping={kwargs['softcap']}")
    if kwargs.get("s_aux") is not None:
        _refuse(module, "learned attention sinks", "the `sinks` parameter of every attention layer of this model_type")
    if kwargs.get("position_bias") is not None or getattr(config, "alibi", False):
        _refuse(module, "an additive position bias (ALiBi / relative bias)", "config key alibi, or position_bias")
    if getattr(config, "attention_chunk_size", None):
        _refuse(module, "chunked attention", f"config key attention_chunk_size={config.attention_chunk_size}")
    if dropout:
        _refuse(module, "attention dropout in training",
                f"config key attention_dropout={dropout}; set it to 0.0 to train with FlashMask")


def _window(module, kwargs: dict) -> int | None:
    w = kwargs.get("sliding_window")
    if w is None:
        w = getattr(module, "sliding_window", None)
    return int(w) if w else None


def _sdpa_with_cache(module, query, key, value, attention_mask, scaling, causal, window):
    """Decode / chunked prefill against a KV cache (``S_q != S_k``): SDPA with a bottom-right aligned causal
    mask, the window and the padding mask, ``[B, S_q, H, D]`` out."""
    b, h, s_q, _ = query.shape
    s_k = key.shape[2]
    q_pos = torch.arange(s_q, device=query.device)[:, None] + (s_k - s_q)
    k_pos = torch.arange(s_k, device=query.device)[None, :]
    allowed = (k_pos <= q_pos) if causal else torch.ones(s_q, s_k, dtype=torch.bool, device=query.device)
    if window:
        allowed = allowed & (k_pos > q_pos - window)
    allowed = allowed[None, None]
    if attention_mask is not None and attention_mask.dim() == 2:
        allowed = allowed & attention_mask[:, None, None, -s_k:].to(device=query.device, dtype=torch.bool)
    groups = h // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)
    return out.transpose(1, 2).contiguous()


def flashmask_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """``transformers`` attention-interface function: ``(attn_output [B, S, H, D], None)``.

    Args:
        module: the attention layer (``is_causal``, ``sliding_window``, ``config`` are read).
        query: ``[B, H, S_q, D]``; key, value: ``[B, H_k, S_k, D]`` (GQA: ``H % H_k == 0``, not repeated).
        attention_mask: what :func:`flashmask_padding_mask` returned: None or a 2-D bool padding mask.
        dropout: must be 0 (``attention_dropout`` in training is refused).
        scaling: the softmax scale the model asks for (Gemma: ``query_pre_attn_scalar ** -0.5``); None = D^-0.5.
        kwargs: ``attn_mask_startend_row_indices`` / ``cu_seq_lens_q`` / ``position_ids`` (the mask, see the module
            docstring), ``sliding_window``; ``softcap`` / ``s_aux`` / ``position_bias`` are refused; the rest (loss
            kwargs such as ``num_items_in_batch``) is ignored.

    Raises:
        FlashMaskUnsupportedError: softcapping, sinks, position bias, chunked attention, dropout > 0.
        ValueError: a 4-D ``attention_mask``; ``cu_seq_lens_q`` with batch > 1; malformed index vectors.
    """
    _check_supported(module, dropout, kwargs)
    causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    window = _window(module, kwargs)
    b, _, s_q, _ = query.shape
    s_k = key.shape[2]
    if s_q != s_k:  # generation against a KV cache: not a packed training batch
        return _sdpa_with_cache(module, query, key, value, attention_mask, scaling, causal, window), None
    sri = _document_startend(kwargs, attention_mask, b, s_q, causal, query.device)
    if window is not None and window < s_q:
        base = sri
        if base is not None and kwargs.get(STARTEND_KEY) is not None and kwargs.get("position_ids") is not None:
            _check_window_exact(module, base, kwargs["position_ids"], window)
        sri = (_cached(base, ("window", window), lambda: fold_sliding_window(base, window, b, s_q, causal,
                                                                               query.device))
               if base is not None else fold_sliding_window(None, window, b, s_q, causal, query.device))
    q, k, v = _autocast_dtype(query, key, value)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, S, H, D] views, no copy
    if q.is_cuda:  # the Hopper kernels take contiguous tensors only; one copy costs less than the slower kernel
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = flashmask_attention(q, k, v, sri, causal=causal, softmax_scale=scaling)
    return out, None


def _autocast_dtype(query, key, value):
    """One dtype for q, k, v, as SDPA gets under autocast: the autocast dtype when autocast is on (the model's
    rotary embedding multiplies q and k by fp32 cos/sin, which leaves them fp32 beside a bf16 v), else v's dtype."""
    dev = query.device.type
    if torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
    elif query.dtype == key.dtype == value.dtype:
        return query, key, value
    else:
        dtype = value.dtype
    return query.to(dtype), key.to(dtype), value.to(dtype)


def flashmask_padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                           mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs):
    """``transformers`` mask-interface function: the 2-D padding mask ``[B, kv_length]`` as given (O(S)), else
    None. Never a ``[B, 1, Q, KV]`` tensor: the document mask and windows are built by the attention function."""
    if attention_mask is not None and attention_mask.dim() == 2:
        return attention_mask[:, -kv_length:]
    return None


def register_flashmask_attention() -> str:
    """Register :func:`flashmask_attention_forward` and :func:`flashmask_padding_mask` under ``"FlashMask"`` in
    ``transformers``' global attention / mask interfaces (idempotent). Returns the name."""
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(FLASHMASK, flashmask_attention_forward)
    AttentionMaskInterface.register(FLASHMASK, flashmask_padding_mask)
    return FLASHMASK


register_flashmask_attention()
