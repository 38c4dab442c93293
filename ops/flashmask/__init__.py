"""FlashMask attention for PyTorch: column-wise interval masks, a Triton kernel and a PyTorch reference.

Public API: :func:`flashmask_attention`; mask builders in :mod:`flashmask.masks`.
"""

from .api import flashmask_attention
from .dense import to_dense

__all__ = ["flashmask_attention", "to_dense"]
