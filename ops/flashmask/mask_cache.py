"""Preprocessed masks (:class:`flashmask.triton_prep.MaskVectors`: vectors, block min/max, visit lists), cached so
that every layer of a batch reuses one preprocessing.

All layers of a forward pass receive the same ``startend_row_indices`` tensor, so the O(N + Tr*Tc)
preprocessing runs once per batch, not once per layer and pass.
"""

from __future__ import annotations

import sys

import torch

from .triton_prep import MaskVectors

_NO_MASK: dict = {}  # (causal, S_q, S_k, device) -> MaskVectors without index tensor
_NO_MASK_ENTRIES = 32  # many distinct lengths (e.g. generation): bounded; about 48 MiB per entry at 128K tokens


def capturing(device) -> bool:
    """True while a CUDA graph is being captured, or while torch.compile's CUDA-graph trees
    (``mode="reduce-overhead"``) warm one up or record it: the warm-up allocates from the graph's private pool, and
    a tensor kept alive past the call there is an error ("tensors in the cudagraph pool not tracked as outputs")."""
    device = torch.device(device)
    if device.type != "cuda":
        return False
    if torch.cuda.is_current_stream_capturing():
        return True
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return False
    try:  # private API (torch 2.11 - 2.13): absent or changed means no graph trees to step around
        manager = trees.get_manager(device.index if device.index is not None else torch.cuda.current_device(),
                                    create_if_none_exists=False)
        return manager is not None and (manager.in_warmup or manager.in_recording)
    except Exception:
        return False


def mask_vectors(sri, causal: bool, seq_q: int, seq_k: int, device) -> MaskVectors:
    """The preprocessed mask of ``sri`` (int32 ``[B, H_mask, S_k, C]`` or None), cached on the index tensor itself.

    The key includes ``sri._version``, so an in-place edit of the indices rebuilds it. Without an index tensor the
    visit lists depend only on the mode and the lengths: they are kept in a small module-level cache. Inference
    tensors (``torch.inference_mode``) have no version counter: rebuilt every call.

    While a CUDA graph is being captured (``torch.compile(mode="reduce-overhead")``, ``torch.cuda.graph``) nothing is
    read from or written to either cache: a replay runs no Python, so lists taken from a cache would be the capture
    call's lists on every replay, whatever mask the static input holds then (and ``_NO_MASK`` may free them). Built
    inside the capture, the preprocessing kernels are part of the graph and rerun on each replay from its input.
    """
    if capturing(device):
        return MaskVectors(sri, causal, seq_q, seq_k, device)
    if sri is None:
        key = (causal, seq_q, seq_k, torch.device(device))
        mv = _NO_MASK.get(key)
        if mv is None:
            if len(_NO_MASK) >= _NO_MASK_ENTRIES:
                _NO_MASK.clear()
            mv = _NO_MASK[key] = MaskVectors(None, causal, seq_q, seq_k, device)
        return mv
    if sri.is_inference():
        return MaskVectors(sri, causal, seq_q, seq_k, device)
    key = (causal, seq_q, seq_k, sri._version)
    cached = getattr(sri, "_flashmask_vectors", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    mv = MaskVectors(sri, causal, seq_q, seq_k, device)
    sri._flashmask_vectors = (key, mv)
    return mv
