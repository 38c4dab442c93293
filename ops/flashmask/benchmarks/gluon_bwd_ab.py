"""A/B of the Gluon backwards against the Triton split backward (one Hopper GPU): ``flashmask.gluon_bwd`` (the
default backward on sm_90 since session 10) and variants of the first design (``flashmask.experimental``).

For each experimental variant: checks dQ / dK / dV against the Triton kernels on a small shape. Then times the
backward alone
(preprocessing included on both sides, ``triton.testing.do_bench`` medians) on ``full`` and ``causal`` at D = 128,
H = 32, B * S = 32K tokens, with the Triton backward timed before and after the variants. Prints one table:
ms and TFLOP/s (2.5 x the forward's 4 B H S^2 D, halved for causal) and the ratio to the Triton backward.

Usage (Hopper GPU, Triton with Gluon, e.g. 3.6): ``python -m flashmask.benchmarks.gluon_bwd_ab [--seq 8192]
[--variants default,regs,...] [--json out.jsonl]``. Results of session 10: ``docs/kernel_notes.md`` (v8).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

VARIANTS = {  # name -> constexpr overrides of flashmask.experimental.DEFAULT_VARIANT (the first, slower design)
    "ws": {},
    "ws_dp_late": dict(DP_EARLY=False),
    "ws_regs": dict(SMEM_OPERANDS=False),
    "ws_acc_init": dict(ACC_INIT=True),
    "ws_ndq1": dict(NDQ=1),
    "ws_split_vec": dict(SPLIT_WORKER=True, VEC_RED=True),
    "ws_regs_split_vec": dict(SMEM_OPERANDS=False, SPLIT_WORKER=True, VEC_RED=True),
    "ws_diag_no_atomic": dict(NO_ATOMIC=True),  # dQ wrong on purpose
    "ws_diag_no_dq": dict(NO_DQ=True),  # dQ wrong on purpose
}


def _check(name, over, causal):
    from flashmask import triton_flashmask as tf
    from flashmask.experimental import gluon_backward

    q, k, v, do = (torch.randn(2, 1024, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = 128 ** -0.5
    o, lse = tf._attention_fwd(q, k, v, None, causal, scale)
    ref = tf._attention_bwd(do, q, k, v, o, lse, None, None, causal, scale, True)
    got = gluon_backward(do, q, k, v, o, lse, scale, causal, **over)
    return [round(float((a.float() - r.float()).abs().max() / r.float().abs().max()), 5) for a, r in zip(got, ref)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=8192, help="sequence length S (a multiple of 128; default 8192)")
    ap.add_argument("--tokens", type=int, default=32768, help="batch * seq (default 32K)")
    ap.add_argument("--variants", default="ws,ws_ndq1,ws_diag_no_dq",
                    help="comma-separated variants of the experimental first design, '' for none; one of: "
                         + ", ".join(VARIANTS))
    ap.add_argument("--json", default=None, help="append one JSON line per (mask, variant)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("gluon_bwd_ab needs an sm_90 GPU (H100 / H200): the Gluon kernels are written for Hopper")
    from triton.testing import do_bench

    from flashmask import triton_flashmask as tf
    from flashmask.experimental import gluon_backward

    names = [n for n in args.variants.split(",") if n]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}")
    for name in names:
        for causal in (False, True):
            print(f"check {name} causal={causal}: rel. max |diff| vs Triton dq/dk/dv = "
                  f"{_check(name, VARIANTS[name], causal)}", flush=True)
    rows = []
    s, b, h, d = args.seq, args.tokens // args.seq, 32, 128
    for causal in (False, True):
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = d ** -0.5
        o, lse = tf._attention_fwd(q, k, v, None, causal, scale)
        flops = 2.5 * 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        split = lambda: tf._attention_bwd(do, q, k, v, o, lse, None, None, causal, scale, True)  # noqa: E731
        t_before = do_bench(split, warmup=50, rep=300)
        gluon = lambda: tf._attention_bwd(do, q, k, v, o, lse, None, None, causal, scale, False)  # noqa: E731
        os.environ["FLASHMASK_BWD"] = "gluon"  # raise rather than time the Triton kernels after a fallback
        times = {"gluon_bwd (the default)": do_bench(gluon, warmup=50, rep=300)}
        os.environ.pop("FLASHMASK_BWD")
        times.update({n: do_bench(lambda: gluon_backward(do, q, k, v, o, lse, scale, causal, **VARIANTS[n]),
                                  warmup=50, rep=300) for n in names})
        t_after = do_bench(split, warmup=50, rep=300)
        t_ref = (t_before + t_after) / 2
        mask = "causal" if causal else "full"
        rows.append((mask, "triton split (before / after)", f"{t_before:.2f} / {t_after:.2f}", flops / t_ref / 1e9,
                     1.0))
        for n, t in times.items():
            rows.append((mask, n, f"{t:.2f}", flops / t / 1e9, t_ref / t))
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(dict(mask=mask, seq=s, batch=b, triton_ms=[t_before, t_after], **times)) + "\n")
    print(f"\n| mask | backward | ms | TFLOP/s | speed vs Triton split |\n|---|---|---|---|---|")
    for mask, n, ms, tf_s, ratio in rows:
        print(f"| {mask} {s} | {n} | {ms} | {tf_s:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
