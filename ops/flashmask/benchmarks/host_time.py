"""Host time of one FlashMask attention call and of its parts, on CUDA.

At B = 1 and 8K tokens a sparse mask runs about 1 ms of kernels, about as long as the Python and driver work that
launches them, so the host can set the pace of an eager call. This prints, per head dim, the median and minimum
host time (µs) of: the forward call, ``backward()`` through autograd, the op's backward body called directly, and
each launch of that body alone. Every timed call is enqueued behind about 45 ms of GPU matmuls, so the host never
waits for the GPU and the numbers are host work only.

Usage: ``python -m flashmask.benchmarks.host_time [--mask v3_causal_document] [--seq 8192] [--calls 30]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def host_us(fn, big: torch.Tensor, calls: int) -> tuple[int, int]:
    """``(median, min)`` µs of host time of ``fn()`` over ``calls`` calls queued behind GPU work."""
    fn()
    torch.cuda.synchronize()
    for _ in range(6):
        big @ big
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(times)), round(min(times))


def main(argv=None) -> None:
    from flashmask import gluon_bwd
    from flashmask.autograd import _attention_bwd, flashmask_attention_triton
    from flashmask.benchmarks.bench_attention import build_v3_mask
    from flashmask.launch_config import LOG2E
    from flashmask.mask_cache import mask_vectors
    from flashmask.triton_launch import dq_from_tiles, preprocess

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mask", default="v3_causal_document")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--calls", type=int, default=30)
    args = p.parse_args(argv)
    big = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; mask {args.mask}, S={args.seq}, B=1, "
          f"H=32; host µs (median, min) over {args.calls} calls")
    print("| D | H_kv | forward call | backward() | backward body | preprocess launch | Gluon backward launch | "
          "dQ conversion launch |")
    print("|---|---|---|---|---|---|---|---|")
    for d, hk in ((128, 32), (64, 8)):
        s = args.seq
        g = torch.Generator(device="cuda").manual_seed(0)
        q, do = (torch.randn(1, s, 32, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(1, s, hk, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        sri, causal = build_v3_mask(args.mask, s)
        sc = d ** -0.5
        o, lse = flashmask_attention_triton(q, k, v, sri, causal, sc)
        out = flashmask_attention_triton(*leaves, sri, causal, sc)[0]
        mv = mask_vectors(sri, causal, s, s, q.device)
        tiles = gluon_bwd.tiles(d)
        acc = torch.empty(q.shape, dtype=torch.float32, device="cuda")
        delta, lse2 = preprocess(o, do, lse, None, acc)

        def backward():
            for x in leaves:
                x.grad = None
            out.backward(do, retain_graph=True)

        row = [
            host_us(lambda: flashmask_attention_triton(*leaves, sri, causal, sc), big, args.calls),
            host_us(backward, big, args.calls),
            host_us(lambda: _attention_bwd(do, q, k, v, o, lse, None, sri, causal, sc, False), big, args.calls),
            host_us(lambda: preprocess(o, do, lse, None, acc), big, args.calls),
            host_us(lambda: gluon_bwd.launch(do, q, k, v, lse2, delta, acc, mv.block_lists(*tiles, by_key=True),
                                             mv.visit_order(*tiles, by_key=True), mv, causal, sc, LOG2E),
                    big, args.calls),
            host_us(lambda: dq_from_tiles(acc, sc, q.dtype, q.shape), big, args.calls),
        ]
        print(f"| {d} | {hk} | " + " | ".join(f"{m} ({lo})" for m, lo in row) + " |", flush=True)


if __name__ == "__main__":
    main()
