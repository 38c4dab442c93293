"""The names scripts import as ``flashmask.triton_flashmask``: the entry point on the GPU kernels and the two
passes on a preprocessed mask. Defined in :mod:`flashmask.autograd` (the torch operation),
:mod:`flashmask.dispatch` (which kernel runs) and :mod:`flashmask.mask_cache` (the per-batch preprocessing).

- ``flashmask_attention_triton(q, k, v, sri, causal, scale, deterministic=False)`` -> ``(out, lse)``;
- ``_mask_vectors(sri, causal, S_q, S_k, device)`` -> the cached ``MaskVectors``;
- ``_fwd(q, k, v, mv, causal, scale)`` -> ``(out, lse)`` and ``_bwd(do, q, k, v, o, lse, dlse, mv, causal,
  scale, deterministic)`` -> ``(dq, dk, dv)``: the kernels alone, without autograd (device-time benchmarks).
"""

from .autograd import flashmask_attention_triton
from .dispatch import backward as _bwd
from .dispatch import forward as _fwd
from .dispatch import gluon_bwd_eligible, gluon_fwd_eligible
from .mask_cache import mask_vectors as _mask_vectors

__all__ = ["flashmask_attention_triton", "gluon_bwd_eligible", "gluon_fwd_eligible"]
