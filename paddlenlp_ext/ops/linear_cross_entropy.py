"""Fused linear + cross entropy, chunked over tokens: the ``[N, V]`` logits never exist whole.

Design after Liger-Kernel's ``FusedLinearCrossEntropy`` (Hsu et al., "Liger Kernel: Efficient Triton Kernels for
LLM Training", arXiv 2410.10989; ``liger_kernel/ops/fused_linear_cross_entropy.py``), written here in plain
PyTorch (no code copied): for each chunk of tokens the forward computes ``logits = h @ W^T (+ b)`` in the compute
dtype, the fp32 log-softmax loss, and at once the gradients ``dlogits = softmax - onehot``,
``grad_h = dlogits @ W`` and ``grad_W += dlogits^T @ h``; the chunk's logits are then freed. ``backward`` only
scales the saved gradients by the incoming scalar gradient. Peak extra memory is one chunk of fp32 logits
(default <= 1 GiB) plus ``grad_W`` in fp32 ``[V, E]``, instead of the bf16 + fp32 logits and their gradients of
``F.cross_entropy(F.linear(h, W).float())`` (4 to 5 copies of ``[N, V]``).

PaddleNLP counterpart: ``use_fused_linear_cross_entropy`` (cut cross entropy in
``paddlenlp/transformers/llama/modeling.py``, TP degree 1 only), which this module serves for the SFT loss.

Numerics: the loss per token is ``logsumexp(z) - z[label]`` with ``z`` the fp32 upcast of the compute-dtype
logits, exactly as ``F.cross_entropy(logits.float(), ...)``; under bf16 autocast the gradient rounding differs
slightly from autograd's (``dlogits`` is rounded to bf16 before being scaled by the loss weight, and ``grad_W`` is
summed over chunks in fp32), within the bf16 error of the unfused path (see tests/fused_ops).
"""

from __future__ import annotations

import torch

from .elementwise import _dispatch

IGNORE_INDEX = -100
DEFAULT_CHUNK_BYTES = 1 << 30  # fp32 logits of one chunk


def default_chunk_size(vocab_size: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Tokens per chunk so that one chunk's fp32 logits ``[chunk, V]`` take at most ``chunk_bytes`` (>= 1).

    Llama-3 vocab 128256 and 1 GiB: 2093 tokens.
    """
    return max(1, int(chunk_bytes) // (4 * int(vocab_size)))


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _chunk_loss(z: torch.Tensor, lab: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Summed CE (fp32 scalar) of logits ``z [c, V]`` (any float dtype, upcast to fp32) against ``lab [c]``."""
    zf = z.float()
    valid = lab != ignore_index  # [c]
    tgt = torch.where(valid, lab, torch.zeros_like(lab))
    lse = torch.logsumexp(zf, dim=-1)  # [c]
    z_t = zf.gather(1, tgt[:, None]).squeeze(1)  # [c]
    return torch.where(valid, lse - z_t, torch.zeros_like(lse)).sum()


def chunk_loss_and_grad(z: torch.Tensor, lab: torch.Tensor, ignore_index: int):
    """Summed CE of one chunk and its logits gradient for a loss weight of 1.

    Args:
        z: logits ``[c, V]`` in the compute dtype (bf16 under autocast, else fp32).
        lab: int64 ``[c]``; ``ignore_index`` rows get loss 0 and gradient 0.

    Returns:
        ``(loss, dz)``: fp32 scalar ``sum(logsumexp(z) - z[label])`` over supervised rows, and
        ``dz = softmax(z) - onehot(label)`` (fp32 math, zero on ignored rows) in ``z``'s dtype ``[c, V]``.
    """
    zf = z.float()
    valid = lab != ignore_index
    tgt = torch.where(valid, lab, torch.zeros_like(lab))
    lse = torch.logsumexp(zf, dim=-1, keepdim=True)  # [c, 1]
    z_t = zf.gather(1, tgt[:, None])  # [c, 1]
    loss = torch.where(valid, (lse - z_t).squeeze(1), torch.zeros_like(lse.squeeze(1))).sum()
    onehot = torch.arange(zf.shape[1], device=zf.device)[None, :] == tgt[:, None]  # [c, V] (fused away)
    dz = torch.where(onehot, (zf - lse).exp() - 1.0, (zf - lse).exp())
    dz = torch.where(valid[:, None], dz, torch.zeros_like(dz))
    return loss, dz.to(z.dtype)


def _chunk_loss_and_grad_inplace(z: torch.Tensor, lab: torch.Tensor, ignore_index: int):
    """:func:`chunk_loss_and_grad` with the softmax written over the fp32 logits (eager path: one ``[c, V]`` fp32
    buffer instead of several temporaries). Overwrites ``z`` when it is fp32 (the caller's fresh GEMM output)."""
    zf = z.float()
    valid = lab != ignore_index
    tgt = torch.where(valid, lab, torch.zeros_like(lab))
    lse = torch.logsumexp(zf, dim=-1)  # [c]
    z_t = zf.gather(1, tgt[:, None]).squeeze(1)
    loss = torch.where(valid, lse - z_t, torch.zeros_like(lse)).sum()
    p = zf.sub_(lse[:, None]).exp_()  # softmax, in place
    p.scatter_add_(1, tgt[:, None], -valid[:, None].float())  # - onehot on supervised rows
    p.mul_(valid[:, None])  # ignored rows: no gradient
    return loss, p.to(z.dtype)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Summed CE of ``hidden @ weight.T (+ bias)`` over ``labels != ignore_index``; gradients made in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index: int, chunk_size: int, cdt: torch.dtype):
        # hidden [N, E], weight [V, E], bias [V] | None, labels int64 [N]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        n = hidden.shape[0]
        dev = hidden.device.type
        with torch.autocast(dev, enabled=False):
            w_c = weight.to(cdt)  # one cast of the head per call (a no-op in fp32)
            h_c = hidden.to(cdt)
            b_c = bias.to(cdt) if bias is not None else None
            grad_h = torch.empty_like(hidden) if need_h else None  # [N, E] in hidden's dtype
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
            grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for s in range(0, n, chunk_size):
                hc, lab = h_c[s: s + chunk_size], labels[s: s + chunk_size]  # [c, E], [c]
                # [c, V] compute dtype; bias added inside the GEMM (one rounding, as F.linear)
                z = hc @ w_c.t() if b_c is None else torch.addmm(b_c, hc, w_c.t())
                if not (need_h or need_w or need_b):
                    loss += _chunk_loss(z, lab, ignore_index)
                    continue
                # loss and dlogits = softmax - onehot (fp32 math, rounded to cdt once): one compiled kernel on
                # CUDA (the logits are read twice and dlogits written once), the same math eagerly elsewhere
                part, g = _dispatch(chunk_loss_and_grad, z, lab, ignore_index, tensors=2,
                                    eager=_chunk_loss_and_grad_inplace)  # fp32 [], [c, V] cdt
                loss += part
                if need_h:
                    grad_h[s: s + chunk_size] = g @ w_c
                if need_w:
                    if cdt == torch.float32:
                        grad_w.addmm_(g.t(), hc)
                    else:
                        grad_w += g.t() @ hc  # bf16 product per chunk, summed in fp32
                if need_b:
                    grad_b += g.float().sum(0)
                del z, g
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        hd, wd, bd = ctx.dtypes
        go = grad_out.float()
        gh = (grad_h * go).to(hd) if grad_h is not None else None
        gw = (grad_w * go).to(wd) if grad_w is not None else None
        gb = (grad_b * go).to(bd) if grad_b is not None else None
        return gh, gw, gb, None, None, None, None


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                               bias: torch.Tensor | None = None, *, ignore_index: int = IGNORE_INDEX,
                               chunk_size: int | None = None, skip_ignored: bool = False) -> torch.Tensor:
    """Summed token cross entropy of the linear head, without materialising the logits.

    Equals ``F.cross_entropy(F.linear(hidden, weight, bias).float(), labels, ignore_index=ignore_index,
    reduction="sum")`` (logits in the autocast dtype when autocast is on, else in the promoted input dtype), with
    gradients for ``hidden``, ``weight`` (and ``bias``) when they require them.

    Args:
        hidden: ``[N, E]`` (or ``[..., E]``, flattened) float, e.g. fp32 final hidden states.
        weight: ``[V, E]`` head weight (the embedding weight when tied); a frozen weight gets no gradient and
            costs no ``[V, E]`` buffer.
        labels: int64 ``[N]`` (or the leading shape of ``hidden``); ``ignore_index`` rows contribute nothing.
        bias: optional ``[V]``.
        ignore_index: label value to skip (-100).
        chunk_size: tokens per chunk; None = :func:`default_chunk_size` (fp32 chunk logits <= 1 GiB).
        skip_ignored: first gather the rows whose label is not ignored (saves their head FLOPs; costs one host
            sync for the data-dependent row count).

    Returns:
        fp32 scalar (nats, summed; 0 when every label is ignored).

    Raises:
        ValueError: mismatched shapes or a non-positive ``chunk_size``.

    Labels outside ``[0, V)`` other than ``ignore_index`` are not checked (that would need a host sync); on CUDA
    ``gather`` then fails with a device-side assert, as ``F.cross_entropy`` does.
    """
    if hidden.shape[-1] != weight.shape[-1] or weight.dim() != 2:
        raise ValueError(f"fused_linear_cross_entropy: hidden [..., E] {list(hidden.shape)} and weight [V, E] "
                         f"{list(weight.shape)} disagree on E")
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"fused_linear_cross_entropy: labels {list(labels.shape)} must have hidden's leading "
                         f"shape {list(hidden.shape[:-1])}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"fused_linear_cross_entropy: bias {list(bias.shape)} must be [V={weight.shape[0]}]")
    if chunk_size is None:
        chunk_size = default_chunk_size(weight.shape[0])
    if chunk_size <= 0:
        raise ValueError(f"fused_linear_cross_entropy: chunk_size must be > 0, got {chunk_size}")
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    if skip_ignored:
        rows = (labels != ignore_index).nonzero().squeeze(1)  # host sync: data-dependent row count
        hidden, labels = hidden.index_select(0, rows), labels.index_select(0, rows)
    cdt = _compute_dtype(hidden, weight)
    if not torch.is_grad_enabled():
        with torch.no_grad():
            return _FusedLinearCrossEntropy.forward(_NoGradCtx(), hidden, weight, bias, labels, ignore_index,
                                                    int(chunk_size), cdt)
    return _FusedLinearCrossEntropy.apply(hidden, weight, bias, labels, ignore_index, int(chunk_size), cdt)


class _NoGradCtx:
    """Stand-in ``ctx`` for evaluation (no gradients wanted, so none are computed or kept)."""

    needs_input_grad = (False, False, False)

    def save_for_backward(self, *args):
        pass
