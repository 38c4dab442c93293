"""FlexAttention bridge: run FlashMask masks through ``torch.nn.attention.flex_attention``.

Route 3 of the FlashMask brief §4.3: the ``mask_mod`` reads the FlashMask vectors through 1-D flattened index
tensors (``vec[(b * H_mask + h) * S_k + kv]``; 2-D indexing inside mask_mod made the FLASH backend ~3.5x slower,
torchtitan PR #2171), and the ``BlockMask`` comes straight from the per-block min/max tile classification
(:func:`flashmask.masks.classify_blocks`): partial tiles -> ``kv_indices``, unmasked tiles -> ``full_kv_indices``,
fully masked tiles -> absent, in O(N + Tr * Tc) with no dense ``[S_q, S_k]`` evaluation (unlike
``create_block_mask``). It is the FlexAttention baseline of the benchmark and a model attention backend.

Layouts: q/k/v ``[B, S, H, D]`` like :func:`flashmask.flashmask_attention`; FlexAttention's block mask heads are
query heads, so a per-head mask (``H_mask = H_k``) is repeated over each GQA group.
"""

from __future__ import annotations

import weakref

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # torch < 2.9
    AuxRequest = None

from .dense import expand_startend
from .masks import PARTIAL, UNMASKED, classify_blocks

DEFAULT_BLOCK_SIZE = 128  # FlexAttention's _DEFAULT_SPARSE_BLOCK_SIZE


def flashmask_mask_mod(startend_row_indices: torch.Tensor, causal: bool, num_heads: int | None = None,
                       seq_q: int | None = None):
    """FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = attend) equal to the FlashMask.

    Args:
        startend_row_indices: int32 ``[B, H_mask, S_k, C]`` (a ``B`` of 1 broadcasts over the batch).
        causal: FlashMask mode (adds ``q_idx >= kv_idx``).
        num_heads: query heads H_q; required when ``H_mask > 1`` (mask head = ``h // (H_q / H_mask)``).
        seq_q: query length S_q (default S_k).

    Raises:
        ValueError: ``H_mask > 1`` without a ``num_heads`` that is a multiple of it.
    """
    b, hm, s_k, c = startend_row_indices.shape
    if hm > 1 and (num_heads is None or num_heads % hm):
        raise ValueError(f"startend_row_indices has H_mask={hm} heads: num_heads (query heads) must be a multiple, "
                         f"got {num_heads}")
    group = num_heads // hm if hm > 1 else 1
    lts, lte, uts, ute = (v.to(torch.int32).reshape(-1) for v in
                          expand_startend(startend_row_indices, causal, s_k if seq_q is None else seq_q))

    def flat(bi, h, kv_idx):
        # create_block_mask may evaluate kv indices past S_k (tail block padding): clamp to stay in bounds
        kv = torch.clamp(kv_idx, max=s_k - 1)
        row = (bi if b > 1 else 0) * hm + (h // group if hm > 1 else 0)
        return row * s_k + kv

    if causal and c == 1:
        def mask_mod(bi, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx < lts[flat(bi, h, kv_idx)])
    elif causal:
        def mask_mod(bi, h, q_idx, kv_idx):
            i = flat(bi, h, kv_idx)
            return (q_idx >= kv_idx) & ((q_idx < lts[i]) | (q_idx >= lte[i]))
    elif c == 2:
        def mask_mod(bi, h, q_idx, kv_idx):
            i = flat(bi, h, kv_idx)
            return (q_idx < lts[i]) & (q_idx >= ute[i])
    else:
        def mask_mod(bi, h, q_idx, kv_idx):
            i = flat(bi, h, kv_idx)
            return ((q_idx < lts[i]) | (q_idx >= lte[i])) & ((q_idx < uts[i]) | (q_idx >= ute[i]))
    return mask_mod


def _ordered(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(count [..], indices [.., Tc])``: selected block indices first (ascending), then the others, in O(Tc).

    The layout ``_dense_to_ordered`` in ``torch/nn/attention/flex_attention.py`` produces (with a stable sort).
    """
    m = sel.to(torch.int64)
    count = m.sum(-1)
    pos = torch.where(sel, m.cumsum(-1) - 1, count[..., None] + (1 - m).cumsum(-1) - 1)  # a permutation per row
    cols = torch.arange(sel.shape[-1], device=sel.device).expand_as(pos)
    idx = torch.zeros_like(pos).scatter_(-1, pos, cols)
    return count.to(torch.int32), idx.to(torch.int32)


def flashmask_block_mask(startend_row_indices: torch.Tensor, causal: bool, num_heads: int | None = None,
                         block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE, seq_q: int | None = None) -> BlockMask:
    """FlexAttention ``BlockMask`` of a FlashMask, built from per-block min/max (no dense mask).

    Args:
        startend_row_indices: int32 ``[B, H_mask, S_k, C]``.
        causal: FlashMask mode. num_heads: query heads (needed when ``H_mask > 1``; the block mask then has
            ``num_heads`` heads). block_size: ``BQ`` or ``(BQ, BKV)``. seq_q: S_q (default S_k).

    Returns:
        ``BlockMask`` with shape ``(B, H_mask or num_heads, S_q, S_k)`` and the :func:`flashmask_mask_mod`.
        A tile that overhangs the sequence end counts as partial, as in ``create_block_mask``. The min/max
        classification is sound but conservative: tiles it cannot decide stay partial, so for some masks
        (union of two intervals, empty ``LTS = LTE`` intervals) the BlockMask lists more partial blocks than
        ``create_block_mask`` would; the attention is identical. For documents, windows and plain masks the
        two are equal.
    """
    bq, bkv = (block_size, block_size) if isinstance(block_size, int) else block_size
    s_k = startend_row_indices.shape[2]
    s_q = s_k if seq_q is None else seq_q
    cls = classify_blocks(startend_row_indices, causal, bq, bkv, s_q)  # int8 [B, H_mask, Tr, Tc]
    if s_q % bq:
        cls[:, :, -1] = torch.where(cls[:, :, -1] == UNMASKED, PARTIAL, cls[:, :, -1])
    if s_k % bkv:
        cls[..., -1] = torch.where(cls[..., -1] == UNMASKED, PARTIAL, cls[..., -1])
    hm = cls.shape[1]
    if hm > 1:
        if num_heads is None or num_heads % hm:
            raise ValueError(f"H_mask={hm}: num_heads (query heads) must be a multiple of it, got {num_heads}")
        cls = cls.repeat_interleave(num_heads // hm, dim=1)  # block-mask heads are query heads
    kv_num, kv_idx = _ordered(cls == PARTIAL)
    full_num, full_idx = _ordered(cls == UNMASKED)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(bq, bkv),
                                    mask_mod=flashmask_mask_mod(startend_row_indices, causal, num_heads, s_q),
                                    seq_lengths=(s_q, s_k))


_compiled_flex = None
_last_block_mask = None  # (weakref to the vectors, their _version, build arguments, BlockMask)


@torch.compiler.disable
def _block_mask_for(sri: torch.Tensor, causal: bool, num_heads: int, block_size, seq_q: int) -> BlockMask:
    """flashmask_block_mask with a one-entry cache: every layer of a model passes the same vectors tensor, so
    the BlockMask is built once per batch. A hit needs the very same tensor object (weak reference, so a freed
    tensor never matches) with an unchanged version counter (in-place edits bump it). Inference tensors
    (``torch.inference_mode``) have no version counter: built every call, never cached.

    Always runs eagerly (``torch.compiler.disable``): under ``torch.compile`` (e.g. compiled decoder layers) the
    returned BlockMask's tensors become graph inputs. Traced, dynamo would keep the first batch's cached
    BlockMask as a constant of the graph and every later batch would run with it: wrong attention, silently
    (measured on an H200: max |diff| 3.5-4.5 against FlashMask on 11 of 12 end-to-end packs)."""
    global _last_block_mask
    if sri.is_inference():
        return flashmask_block_mask(sri, causal, num_heads=num_heads, block_size=block_size, seq_q=seq_q)
    key = (causal, num_heads, block_size, seq_q)
    if _last_block_mask is not None:
        ref, version, old_key, bm = _last_block_mask
        if ref() is sri and sri._version == version and old_key == key:
            return bm
    bm = flashmask_block_mask(sri, causal, num_heads=num_heads, block_size=block_size, seq_q=seq_q)
    _last_block_mask = (weakref.ref(sri), sri._version, key, bm)
    return bm


def flex_flashmask_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             startend_row_indices: torch.Tensor | None, causal: bool = True,
                             softmax_scale: float | None = None, block_mask: BlockMask | None = None,
                             block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE, compile: bool | None = None,
                             return_softmax_lse: bool = False, kernel_options: dict | None = None):
    """FlashMask attention computed by FlexAttention (same contract as :func:`flashmask.flashmask_attention`).

    Args:
        query: ``[B, S_q, H_q, D]``; key, value: ``[B, S_k, H_k, D]``; GQA when ``H_q != H_k``.
        startend_row_indices: int32 ``[B, H_mask, S_k, C]``, or None (plain causal / full).
        block_mask: a prebuilt :func:`flashmask_block_mask`. Without it the BlockMask is built from the vectors
            and cached for the same (unmodified) tensor object, so the layers of one forward share it.
        compile: use ``torch.compile(flex_attention)`` (the fused Triton kernel); default: on CUDA only.
            Eager mode materialises the scores (tests on CPU).
        kernel_options: passed through (e.g. ``{"BACKEND": "FLASH"}``).

    Returns:
        ``out [B, S_q, H_q, D]`` (and the natural-log LSE fp32 ``[B, H_q, S_q]`` when asked). Rows that
        attend to nothing give 0 (FlexAttention's convention, as FlashMask).
    """
    global _compiled_flex
    b, s_q, h_q, _ = query.shape
    s_k = key.shape[1]
    if block_mask is None:
        sri = startend_row_indices
        if sri is None:  # plain attention, written as FlashMask vectors (not cached: a fresh tensor each call)
            sri = torch.full((1, 1, s_k, 1 if causal else 2), s_q, dtype=torch.int32, device=query.device)
            if not causal:
                sri[..., 1] = 0
            block_mask = flashmask_block_mask(sri, causal, num_heads=h_q, block_size=block_size, seq_q=s_q)
        else:
            block_mask = _block_mask_for(sri, causal, h_q, block_size, s_q)
    compile = query.is_cuda if compile is None else compile
    fn = flex_attention
    if compile:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        fn = _compiled_flex
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, H, S, D]
    kw = dict(block_mask=block_mask, scale=softmax_scale, enable_gqa=key.shape[2] != h_q, kernel_options=kernel_options)
    if not return_softmax_lse:
        return fn(q, k, v, **kw).transpose(1, 2)
    if AuxRequest is not None:  # torch >= 2.9; return_lse is deprecated there
        out, aux = fn(q, k, v, return_aux=AuxRequest(lse=True), **kw)
        lse = aux.lse
    else:
        out, lse = fn(q, k, v, return_lse=True, **kw)
    return out.transpose(1, 2), lse.float()
