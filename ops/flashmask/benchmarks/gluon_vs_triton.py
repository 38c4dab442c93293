"""The Gluon kernels against the Triton kernels, forward and backward alone (one sm_90 GPU): the measurement behind
the default ``FLASHMASK_FWD`` / ``FLASHMASK_BWD`` = ``auto`` (Gluon on Hopper at head dims 64, 128 and 256).

Both sides run through :func:`flashmask.dispatch.forward` / :func:`~flashmask.dispatch.backward` with the
environment switch set per call (``gluon`` or ``triton``) on the same preprocessed mask. First a check on small
shapes of several masks (GQA included): O / LSE and dQ / dK / dV of the Gluon kernels against the Triton ones.
Then the forward and the backward (its Delta preprocessing included) timed with ``bench_attention.bench``
(>= 10 samples) at D = ``--head_dim`` (128), H = ``--heads`` (32), B * S = ``--tokens``, two rounds with the order
reversed in the second.
Prints a markdown table: ms per round, TFLOP/s on unmasked pairs (backward 2.5x the forward's FLOPs) and the
speed of Gluon over Triton.

Usage (sm_90 GPU, a Triton whose Gluon the kernels support, ``dispatch.SUPPORTED_TRITON``):
``python -m flashmask.benchmarks.gluon_vs_triton [--seq 8192] [--tokens 32768] [--masks full,causal,...]
[--head_dim 256 --heads 16]``.
"""

from __future__ import annotations

import argparse
import os

import torch

MASKS = "full,causal,causal_document,document,global_sliding,qk_sparse"
CHECK = (("full", 4, 4), ("causal", 4, 4), ("causal_document", 4, 4), ("causal_document", 8, 2), ("document", 4, 4),
         ("global_sliding", 4, 4), ("share_question", 4, 4))


def _with_kernel(kernel: str, fn):
    """``fn()`` with ``FLASHMASK_FWD`` and ``FLASHMASK_BWD`` set to ``kernel`` ("gluon" / "triton")."""
    old = {k: os.environ.get(k) for k in ("FLASHMASK_FWD", "FLASHMASK_BWD")}
    os.environ.update(FLASHMASK_FWD=kernel, FLASHMASK_BWD=kernel)
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def passes(q, k, v, do, sri, causal):
    """``(forward(), backward(o, lse))`` callables for one input on its cached mask vectors."""
    from flashmask import dispatch
    from flashmask.mask_cache import mask_vectors

    scale = q.shape[-1] ** -0.5
    mv = mask_vectors(sri, causal, q.shape[1], k.shape[1], q.device)
    return (lambda: dispatch.forward(q, k, v, mv, causal, scale),
            lambda o, lse: dispatch.backward(do, q, k, v, o, lse, None, mv, causal, scale, False))


def check(seq: int = 2048, d: int = 128) -> float:
    """Largest relative difference of Gluon's O, LSE, dQ, dK, dV from the Triton kernels' over the check cases at
    head dim ``d`` (inf when the rows with no visible key differ)."""
    from flashmask.benchmarks.bench_attention import build_mask

    worst = 0.0
    for mask, hq, hk in CHECK:
        torch.manual_seed(hq)
        sri, causal = build_mask(mask, seq, 2)
        q, do = (torch.randn(2, seq, hq, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(2, seq, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fwd, bwd = passes(q, k, v, do, sri, causal)
        res = {}
        for kernel in ("triton", "gluon"):
            o, lse = _with_kernel(kernel, fwd)
            res[kernel] = (o, lse, *_with_kernel(kernel, lambda: bwd(o, lse)))
        fin = torch.isfinite(res["triton"][1])
        if not torch.equal(torch.isfinite(res["gluon"][1]), fin):
            return float("inf")
        for i, (a, b) in enumerate(zip(res["gluon"], res["triton"])):
            a, b = (a[fin] if i == 1 else a).float(), (b[fin] if i == 1 else b).float()
            worst = max(worst, float((a - b).abs().max() / b.abs().max().clamp(min=1e-6)))
    return worst


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--masks", default=MASKS)
    ap.add_argument("--head_dim", type=int, default=128, help="D of q, k, v (64, 128 or 256)")
    ap.add_argument("--heads", type=int, default=32, help="query heads (KV heads: as many)")
    ap.add_argument("--check-only", action="store_true", help="only the check against the Triton kernels")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("gluon_vs_triton needs an sm_90 GPU (H100 / H200): the Gluon kernels are written for Hopper")
    from flashmask.benchmarks.bench_attention import allowed_count, bench, build_mask

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}")
    worst = check(d=args.head_dim)
    print(f"# check: Gluon vs Triton kernels, max relative difference over O, LSE, dQ, dK, dV: {worst:.2e}",
          flush=True)
    if args.check_only or not worst < 2e-2:
        return
    s, b, h, d = args.seq, max(1, args.tokens // args.seq), args.heads, args.head_dim
    print(f"# B={b} H={h} D={d} bf16")
    print(f"\n| mask | S | pass | Triton ms (round 1 / 2) | Gluon ms (round 1 / 2) | Triton TFLOP/s | Gluon TFLOP/s | "
          "Gluon / Triton speed |\n|---|---|---|---|---|---|---|---|")
    for mask in args.masks.split(","):
        sri, causal = build_mask(mask, s, b)
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        flops = 4 * h * d * allowed_count(sri, causal, b, s)
        fwd, bwd = passes(q, k, v, do, sri, causal)
        o, lse = _with_kernel("triton", fwd)
        times = {(p, kernel): [] for p in ("forward", "backward") for kernel in ("triton", "gluon")}
        for order in (("triton", "gluon"), ("gluon", "triton")):
            for kernel in order:
                times["forward", kernel].append(bench(lambda: _with_kernel(kernel, fwd)))
                times["backward", kernel].append(bench(lambda: _with_kernel(kernel, lambda: bwd(o, lse))))
        for p, mult in (("forward", 1.0), ("backward", 2.5)):
            tt, tg = times[p, "triton"], times[p, "gluon"]
            mt, mg = sum(tt) / 2, sum(tg) / 2
            print(f"| {mask} | {s} | {p} | {tt[0]:.3f} / {tt[1]:.3f} | {tg[0]:.3f} / {tg[1]:.3f} | "
                  f"{mult * flops / mt / 1e9:.0f} | {mult * flops / mg / 1e9:.0f} | {mt / mg:.3f}x |", flush=True)
        del q, k, v, do, o, lse


if __name__ == "__main__":
    main()
