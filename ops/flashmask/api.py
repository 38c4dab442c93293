"""Public entry point: ``flashmask_attention`` (validation and dispatch only).

API shaped like Paddle's ``paddle.nn.functional.flashmask_attention``
(python/paddle/nn/functional/flash_attention.py); the layout is ``[batch, seq, heads, head_dim]``.
"""

from __future__ import annotations

import torch

_IMPLS = ("auto", "triton", "reference")


def _check(cond: bool, msg) -> None:
    """ValueError(msg) unless ``cond``. ``msg`` is a string or a zero-argument callable returning one: the messages
    that format sizes are built only on failure, because formatting a symbolic size under ``torch.compile`` pins it
    to its value (a guard), and every new sequence length then recompiled the layers that call the attention."""
    if not cond:
        raise ValueError(msg() if callable(msg) else msg)


def sliding_window_startend(window_size, seq_len: int, causal: bool, batch: int, device,
                            seq_q: int | None = None) -> torch.Tensor:
    """FlashMask vectors of a sliding window, int32 ``[batch, 1, seq_len, C]`` (``seq_len`` = S_k).

    Row indices are clamped to ``seq_q`` (default ``seq_len``), the number of query rows.

    ``causal=True``: ``window_size`` is ``w`` (or ``(w, 0)``); query i sees keys ``[i-w, i]``, LTS_j = min(j+w+1, S).
    ``causal=False``: ``window_size`` is ``(wl, wr)``; query i sees keys ``[i-wl, i+wr]``,
    LTS_j = min(j+wl+1, S), UTE_j = max(j-wr, 0) (Paddle's conversion).
    """
    if isinstance(window_size, int):
        wl, wr = window_size, (0 if causal else window_size)
    else:
        wl, wr = window_size
    _check(wl >= 0 and wr >= 0, lambda: f"window_size must be non-negative, got {window_size}")
    seq_q = seq_len if seq_q is None else seq_q
    j = torch.arange(seq_len, device=device)
    lts = torch.clamp(j + wl + 1, max=seq_q)
    if causal:
        _check(wr == 0, lambda: f"causal sliding window takes window_size=w or (w, 0), got {window_size}")
        vec = lts[:, None]
    else:
        vec = torch.stack([lts, torch.clamp(j - wr, min=0, max=seq_q)], dim=-1)
    return vec.to(torch.int32)[None, None].expand(batch, 1, seq_len, vec.shape[-1]).contiguous()


_LAYOUT = " (layout [batch, seq, heads, head_dim]; for [batch, heads, seq, head_dim] tensors pass .transpose(1, 2))"


def _validate_qkv(query, key, value, causal, impl):
    _check(impl in _IMPLS, lambda: f"impl must be one of {_IMPLS}, got {impl!r}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check(isinstance(t, torch.Tensor), lambda: f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _check(t.dim() == 4, lambda: f"{name} must have shape [batch, seq, heads, head_dim], got {list(t.shape)}")
        _check(t.dtype in (torch.float16, torch.bfloat16, torch.float32),
               lambda: f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    b, s_q, h_q, d = query.shape
    _check(key.dtype == query.dtype and value.dtype == query.dtype,
           lambda: f"query, key, value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    _check(key.device == query.device and value.device == query.device,
           lambda: f"query, key, value must be on one device, got {query.device}, {key.device}, {value.device}")
    _check(key.shape == value.shape, lambda: f"key and value shapes differ: {list(key.shape)} vs {list(value.shape)}")
    _check(key.shape[0] == b and key.shape[3] == d,
           lambda: f"key must be [batch={b}, seq_k, heads_k, head_dim={d}], got {list(key.shape)}")
    s_k, h_k = key.shape[1], key.shape[2]
    _check(h_k > 0 and h_q % h_k == 0,
           lambda: f"query heads ({h_q}) must be a multiple of key/value heads ({h_k})" + _LAYOUT)
    if causal:
        _check(s_q == s_k, lambda: f"causal=True requires seq_q == seq_k, got seq_q={s_q}, seq_k={s_k}" + _LAYOUT)


def _validate_startend(query, key, sri, causal):
    if sri is None:
        return
    b, s_q = query.shape[:2]
    s_k, h_k = key.shape[1], key.shape[2]
    _check(isinstance(sri, torch.Tensor) and sri.dim() == 4,
           lambda: f"startend_row_indices must be a 4-D tensor [batch, heads_mask, seq_k, C], got "
           f"{list(sri.shape) if isinstance(sri, torch.Tensor) else type(sri).__name__}")
    _check(sri.dtype == torch.int32,
           lambda: f"startend_row_indices must be int32, got {sri.dtype}; convert it with .to(torch.int32)")
    _check(sri.device == query.device, lambda: f"startend_row_indices is on {sri.device}, query on {query.device}")
    _check(sri.shape[0] == b and sri.shape[2] == s_k,
           lambda: f"startend_row_indices must be [batch={b}, heads_mask, seq_k={s_k}, C], got {list(sri.shape)}"
           + _LAYOUT)
    _check(sri.shape[1] in (1, h_k),
           lambda: f"startend_row_indices heads_mask must be 1 or heads_k={h_k}, got {sri.shape[1]}: one mask per "
           f"key/value head at most (per-query-head masks are not supported, as in Paddle's flashmask_attention)")
    allowed_c = (1, 2) if causal else (2, 4)
    _check(sri.shape[3] in allowed_c,
           lambda: f"startend_row_indices last dim must be in {allowed_c} when causal={causal}, got {sri.shape[3]} "
           f"(causal: [LTS] or [LTS, LTE]; non-causal: [LTS, UTE] or [LTS, LTE, UTS, UTE])")
    if sri.numel() and not torch.compiler.is_compiling():
        lo, hi = _index_range(sri)
        _check(lo >= 0 and hi <= s_q,
               lambda: f"startend_row_indices values must lie in [0, seq_q={s_q}], got min {lo}, max {hi}")


def _index_range(sri: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` of the indices, cached on the tensor (keyed by its version counter).

    Reading them is a device-to-host sync; every layer of a model receives the same index tensor, so one sync
    per batch instead of one per layer. An in-place edit bumps ``sri._version`` and forces a fresh read.
    Inference tensors (``torch.inference_mode``) have no version counter: read every call, never cached.
    """
    if sri.is_inference():
        return tuple(int(x) for x in torch.aminmax(sri))
    cached = getattr(sri, "_flashmask_range", None)
    if cached is not None and cached[0] == sri._version:
        return cached[1], cached[2]
    lo, hi = (int(x) for x in torch.aminmax(sri))
    sri._flashmask_range = (sri._version, lo, hi)
    return lo, hi


def flashmask_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    startend_row_indices: torch.Tensor | None = None,
    *,
    causal: bool = True,
    softmax_scale: float | None = None,
    window_size: int | tuple[int, int] | None = None,
    dropout: float = 0.0,
    return_softmax_lse: bool = False,
    deterministic: bool = False,
    impl: str = "auto",
):
    """FlashMask attention: softmax attention under a column-wise interval mask.

    Args:
        query: ``[B, S_q, H_q, D]`` fp16/bf16 (fp32 where the implementation supports it).
        key, value: ``[B, S_k, H_k, D]``, same dtype and device; ``H_q`` a multiple of ``H_k`` (GQA/MQA).
        startend_row_indices: int32 ``[B, H_mask, S_k, C]``, ``H_mask`` in {1, H_k}. Key column j is masked for
            query rows in ``[LTS_j, LTE_j)`` and ``[UTS_j, UTE_j)``. causal=True: C=1 ``[LTS]`` or C=2
            ``[LTS, LTE]``; causal=False: C=2 ``[LTS, UTE]`` or C=4 ``[LTS, LTE, UTS, UTE]``. Values in
            ``[0, S_q]``. None means plain causal or full attention. Builders: :mod:`flashmask.masks`.
        causal: add the causal mask (query i sees keys j <= i); requires ``S_q == S_k``. Default True (Paddle's
            default is False: pass it explicitly when porting, a C=2 mask means different vectors in each mode).
        softmax_scale: score multiplier, default ``D ** -0.5``.
        window_size: sliding window (``w`` causal, ``(wl, wr)`` bidirectional); exclusive with indices.
        dropout: must be 0.0; attention dropout is not implemented (a non-zero value raises).
        return_softmax_lse: also return the natural-log LSE, fp32 ``[B, H_q, S_q]`` (-inf for empty rows).
        deterministic: guarantee a bitwise-reproducible backward (as does
            ``torch.use_deterministic_algorithms(True)``). Without it the Triton path is reproducible too (dQ
            from its own kernel, no atomics) except on sm_90 GPUs at head dims 64 and 128, where the faster Gluon
            backward sums dQ with fp32 TMA reduce-adds (``FLASHMASK_BWD=triton`` turns it off).
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (Triton on CUDA, reference elsewhere). An explicit
            choice never falls back.

    Returns:
        ``out [B, S_q, H_q, D]`` in the query dtype, or ``(out, softmax_lse)`` when asked. Rows that attend to
        nothing give 0 output and 0 gradients.

    Raises:
        ValueError: on any malformed argument; the message gives the expected and actual values. Also
            ``impl="triton"`` with bf16 tensors on CPU under ``TRITON_INTERPRET=1`` (the interpreter computes bf16
            dots wrongly).
        RuntimeError: ``impl="triton"`` with CPU tensors and no ``TRITON_INTERPRET=1``.
        ModuleNotFoundError: ``impl="triton"`` (or ``"auto"`` with CUDA tensors) without the ``triton`` package.

    Source: Paddle ``flashmask_attention`` and FlashMask (Wang et al., ICLR 2025, arXiv 2410.01359).
    """
    _check(dropout == 0.0,
           lambda: f"dropout must be 0.0: FlashMask attention dropout is not implemented, got {dropout}")
    _validate_qkv(query, key, value, causal, impl)
    if window_size is not None:
        _check(startend_row_indices is None, "window_size and startend_row_indices cannot be combined")
        startend_row_indices = sliding_window_startend(window_size, key.shape[1], causal, query.shape[0],
                                                       query.device, seq_q=query.shape[1])
    _validate_startend(query, key, startend_row_indices, causal)
    scale = query.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)

    if impl == "auto":
        impl = "triton" if query.is_cuda else "reference"
    if impl == "triton":
        from .autograd import flashmask_attention_triton

        out, lse = flashmask_attention_triton(query, key, value, startend_row_indices, causal, scale, deterministic)
    else:
        from .reference import flashmask_attention_reference

        out, lse = flashmask_attention_reference(query, key, value, startend_row_indices, causal, scale)
    return (out, lse) if return_softmax_lse else out
