"""Measured experiments kept for the next attempt; nothing here is used by ``flashmask_attention``.

- ``gluon_bwd_ws``: the first warp-specialised, five-product backward in Gluon (session 10): its two consumer
  warpgroups split each 128-key block and meet at a barrier on every query block; 7-20 % *slower* than the
  Triton split backward. The design that won (independent warpgroups, partial dQ tiles) became
  ``flashmask.gluon_bwd``, the default backward on Hopper.

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
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ..triton_bwd import _flashmask_bwd_preprocess_kernel
    from ..triton_flashmask import LOG2E
    from .gluon_bwd_ws import gluon_bwd_ws_kernel

    b, s, h, d = q.shape
    for name, t in (("do", do), ("q", q), ("k", k), ("v", v), ("o", o)):
        if t.shape != q.shape or t.dtype != torch.bfloat16 or not t.is_contiguous() or not t.is_cuda:
            raise ValueError(f"gluon_backward: {name} must be a contiguous bf16 CUDA tensor of q's shape "
                             f"[B, S, H, 128]; got {tuple(t.shape)} {t.dtype}")
    if d != 128 or s % BLOCK_N:
        raise ValueError(f"gluon_backward: head dim must be 128 and S a multiple of {BLOCK_N}; got D={d}, S={s}")
    cfg = dict(DEFAULT_VARIANT, **variant)
    delta = torch.empty_like(lse)
    lse2 = torch.empty_like(lse)
    _flashmask_bwd_preprocess_kernel[(triton.cdiv(s, 64), b * h)](
        o, do, lse, lse, delta, lse2, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1),
        do.stride(2), s, h, LOG2E, D=d, BLOCK_D=d, BLOCK_M=64, HAS_DLSE=False, num_warps=4, num_stages=1)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq_accum = torch.zeros(b * h, s, d, dtype=torch.float32, device=q.device)

    def desc(t, block):
        dt = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float32
        return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, dt))

    rows = lambda t: t.view(b * s, h * d)  # noqa: E731
    gluon_bwd_ws_kernel[(s // BLOCK_N, b * h)](
        desc(rows(q), [BLOCK_M, d]), desc(rows(k), [BLOCK_N, d]), desc(rows(v), [BLOCK_N, d]),
        desc(rows(do), [BLOCK_M, d]), desc(rows(dk), [BLOCK_N, d]), desc(rows(dv), [BLOCK_N, d]),
        desc(lse2.view(-1, BLOCK_M), [1, BLOCK_M]), desc(delta.view(-1, BLOCK_M), [1, BLOCK_M]), dq_accum,
        s, h, scale * LOG2E, scale, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D=d, CAUSAL=causal,
        num_warps=8, maxnreg=168, **cfg)
    dq = (dq_accum.view(b, h, s, d).transpose(1, 2) * scale).to(q.dtype)
    return dq, dk, dv
