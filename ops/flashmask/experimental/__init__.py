"""Measured experiments kept for the next attempt; nothing here is used by ``flashmask_attention``.

- ``gluon_bwd_ws``: the first warp-specialised, five-product backward in Gluon (session 10): its two consumer
  warpgroups split each 128-key block and meet at a barrier on every query block; 7-20 % *slower* than the
  Triton split backward. The design that won in session 10 (independent warpgroups, partial dQ tiles) became
  ``flashmask.gluon_bwd``, the default backward on Hopper; since session 12 (v10) its warpgroups do meet once per
  query block, through an mbarrier on a shared dS tile, to split dQ by head-dim halves.

Host side: ``gluon_backward`` below; A/B script ``flashmask.benchmarks.gluon_bwd_ab``; results in
``docs/kernel_notes.md`` (v8).
"""

from __future__ import annotations

BLOCK_M, BLOCK_N = 64, 128
DEFAULT_VARIANT = dict(NS=2, NDQ=2, SMEM_OPERANDS=True, DP_EARLY=True, ACC_INIT=False, NO_DQ=False, NO_ATOMIC=False,
                       SPLIT_WORKER=False, VEC_RED=False)


def gluon_backward(do, q, k, v, o, lse, scale: float, causal: bool, **variant):
    """dQ, dK, dV of ``softmax(q k^T * scale) v`` (no mask or causal) with the Gluon kernel.

    Args:
        do, q, k, v, o: bf16 ``[B, S, H, 128]``, contiguous, ``S % 128 == 0`` (MHA: k / v have H heads too).
        lse: fp32 ``[B, H, S]`` natural-log LSE of the forward (``triton_flashmask._attention_fwd``).
        scale: softmax scale. causal: the causal mask (else none).
        variant: constexpr overrides of ``DEFAULT_VARIANT``.

    Returns:
        ``(dq, dk, dv)``, bf16 like q, k, v.

    Raises:
        ValueError: for shapes, dtypes or layouts outside the kernel's scope (named in the message).
    """
    import torch

    from ..gluon_bwd import tensor_desc
    from ..triton_flashmask import LOG2E, _preprocess
    from .gluon_bwd_ws import gluon_bwd_ws_kernel

    b, s, h, d = q.shape
    for name, t in (("do", do), ("q", q), ("k", k), ("v", v), ("o", o)):
        if t.shape != q.shape or t.dtype != torch.bfloat16 or not t.is_contiguous() or not t.is_cuda:
            raise ValueError(f"gluon_backward: {name} must be a contiguous bf16 CUDA tensor of q's shape "
                             f"[B, S, H, 128]; got {tuple(t.shape)} {t.dtype}")
    if d != 128 or s % BLOCK_N:
        raise ValueError(f"gluon_backward: head dim must be 128 and S a multiple of {BLOCK_N}; got D={d}, S={s}")
    cfg = dict(DEFAULT_VARIANT, **variant)
    delta, lse2 = _preprocess(o, do, lse, None)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq_accum = torch.zeros(b * h, s, d, dtype=torch.float32, device=q.device)
    desc = tensor_desc
    rows, cols = b * s, h * d
    lrows = b * h * s // BLOCK_M
    gluon_bwd_ws_kernel[(s // BLOCK_N, b * h)](
        desc(q, rows, cols, [BLOCK_M, d]), desc(k, rows, cols, [BLOCK_N, d]), desc(v, rows, cols, [BLOCK_N, d]),
        desc(do, rows, cols, [BLOCK_M, d]), desc(dk, rows, cols, [BLOCK_N, d]), desc(dv, rows, cols, [BLOCK_N, d]),
        desc(lse2, lrows, BLOCK_M, [1, BLOCK_M]), desc(delta, lrows, BLOCK_M, [1, BLOCK_M]), dq_accum,
        s, h, scale * LOG2E, scale, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D=d, CAUSAL=causal,
        num_warps=8, maxnreg=168, **cfg)
    dq = (dq_accum.view(b, h, s, d).transpose(1, 2) * scale).to(q.dtype)
    return dq, dk, dv
