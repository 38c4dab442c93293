"""Host or device: what paces one forward+backward of ours and of FlexAttention in V3's setting.

A B = 1, 8K call on a sparse mask runs under a millisecond of kernels, about what the host needs to issue them, so
an eager timing can measure the host instead of the kernels. Per mask, for ours
(``flashmask_attention_triton``) and for FlexAttention (compiled, the same mask as in ``bench_attention``), one
forward + ``backward()`` is timed four ways:

- **device ms**: the GPU kernels of one call, summed (torch.profiler over ``--calls`` calls): the kernels alone;
- **back-to-back ms**: CUDA events around ``--calls`` calls issued without a pause, per call;
- **do_bench ms**: ``triton.testing.do_bench(warmup=25, rep=150)`` median, the L2 flushed before each call
  (FlashMask V3's same-run method, ``bench_attention --v3``);
- **host ms**: the host's time to issue one call, queued behind GPU matmuls so that it never waits
  (``host_time.host_us``).

A call whose host ms exceeds its device ms is host-bound: its eager timings read the host.

Usage: ``python -m flashmask.benchmarks.host_vs_device [--head-dim 128] [--kv-heads 32] [--seq 8192]
[--masks v3_causal_document,...] [--calls 30]``. Needs CUDA.
"""

from __future__ import annotations

import argparse

import torch

DEFAULT_MASKS = ("v3_causal_document", "v3_sliding_window_1024", "v3_document_bidir", "v3_prefix_lm_1/4")
COLUMNS = ("device_ms", "b2b_ms", "do_bench_ms", "host_ms")


def device_ms(fn, calls: int) -> float:
    """Summed GPU kernel time of one ``fn()`` (ms), over ``calls`` calls under torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.device_time for e in prof.events() if e.device_type == DeviceType.CUDA) / calls / 1e3


def back_to_back_ms(fn, calls: int) -> float:
    """CUDA-event time of ``calls`` calls of ``fn()`` issued back to back, per call (ms)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def table(rows: list[dict]) -> str:
    """Markdown table of ``rows`` (``mask``, ``impl``, the ``COLUMNS``), then per mask flex / ours of each column."""
    lines = ["| mask | impl | device ms | back-to-back ms | do_bench ms | host ms | paced by |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        paced = "host" if r["host_ms"] > r["device_ms"] else "device"
        lines.append(f"| {r['mask']} | {r['impl']} | " + " | ".join(f"{r[c]:.3f}" for c in COLUMNS) + f" | {paced} |")
    by_mask: dict = {}
    for r in rows:
        by_mask.setdefault(r["mask"], {})[r["impl"]] = r
    for mask, pair in by_mask.items():
        if "ours" in pair and "flex" in pair:
            ratios = ", ".join(f"{c.removesuffix('_ms')} {pair['flex'][c] / pair['ours'][c]:.2f}x"
                               for c in COLUMNS[:3])
            lines.append(f"{mask}: flex / ours {ratios}")
    return "\n".join(lines)


def main(argv=None) -> None:
    from torch.nn.attention.flex_attention import flex_attention
    from triton.testing import do_bench

    from flashmask.autograd import flashmask_attention_triton
    from flashmask.benchmarks.bench_attention import FlexMask, build_v3_mask, raise_recompile_limits
    from flashmask.benchmarks.host_time import host_us

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=0, help="K/V heads (GQA; default: --heads)")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--masks", default=",".join(DEFAULT_MASKS))
    p.add_argument("--calls", type=int, default=30)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("host_vs_device needs a CUDA GPU")
    raise_recompile_limits()
    flex = torch.compile(flex_attention, dynamic=False)
    s, d, h = args.seq, args.head_dim, args.heads
    hk = args.kv_heads or h
    gqa = {"enable_gqa": True} if hk != h else {}
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, s, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for n in (h, hk, hk, h))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    leaves_t = [t.transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v)]
    do_t = do.transpose(1, 2).contiguous()
    fm = FlexMask(1, s)
    big = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__}; "
          f"B=1 S={s} H={h} H_kv={hk} D={d} bf16; forward + backward(), {args.calls} calls per timing", flush=True)
    rows = []
    for name in [m for m in args.masks.split(",") if m]:
        sri, causal = build_v3_mask(name, s)
        bm, _ = fm.block_mask(sri, causal)

        def ours():
            flashmask_attention_triton(*leaves, sri, causal, d ** -0.5, False)[0].backward(do)

        def flex_fb():
            flex(*leaves_t, block_mask=bm, scale=d ** -0.5, **gqa).backward(do_t)

        for impl, fn, grads in (("ours", ours, leaves), ("flex", flex_fb, leaves_t)):
            def call(fn=fn, grads=grads):  # one forward + backward() with fresh gradients
                for x in grads:
                    x.grad = None
                fn()

            for _ in range(5):
                call()
            row = dict(mask=name, impl=impl, device_ms=device_ms(call, args.calls),
                       b2b_ms=back_to_back_ms(call, args.calls),
                       do_bench_ms=do_bench(fn, warmup=25, rep=150, grad_to_none=grads, return_mode="median"),
                       host_ms=host_us(call, big, args.calls)[0] / 1e3)
            rows.append(row)
            print(f"{name} {impl}: " + " ".join(f"{c} {row[c]:.3f}" for c in COLUMNS), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
