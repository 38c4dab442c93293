"""A/B of the Gluon forward (``flashmask.gluon_fwd``) against the Triton forward (one Hopper GPU).

For each variant (K / V ring depth): O and LSE against the Triton forward on small shapes
of several masks (GQA included); then the forward alone, timed with ``bench_attention.bench`` (>= 10 samples) on
the benchmark's masks at D = 128, H = 32, B * S = 32K tokens, variants rotated over two rounds with the Triton
forward in each round. Prints one table: ms, TFLOP/s on unmasked elements and the speed against Triton.

Usage (sm_90 GPU, Triton with Gluon, e.g. 3.6): ``python -m flashmask.benchmarks.gluon_fwd_ab [--seq 8192]
[--masks full,causal,...] [--variants ns3,ns2]``. Results: ``docs/kernel_notes.md`` (v10 and v11 forward rows).
"""

from __future__ import annotations

import argparse

import torch

# K / V ring depth (session 12 also measured a ping-pong; session 13 products without the overlap)
VARIANTS = {"ns3": dict(stages=3), "ns2": dict(stages=2)}


def _gluon(q, k, v, sri, causal, variant):
    from flashmask import gluon_fwd
    from flashmask import triton_flashmask as tf

    mv = tf._mask_vectors(sri, causal, q.shape[1], k.shape[1], q.device)
    lists = tf._lists(mv, gluon_fwd.BLOCK_M.value, gluon_fwd.BLOCK_N.value, by_key=False)
    return gluon_fwd.launch(q, k, v, lists, mv, causal, q.shape[-1] ** -0.5, tf.LOG2E, **variant)


def _triton(q, k, v, sri, causal):
    import os

    from flashmask import triton_flashmask as tf

    os.environ["FLASHMASK_FWD"] = "triton"
    try:
        return tf._attention_fwd(q, k, v, sri, causal, q.shape[-1] ** -0.5)
    finally:
        os.environ.pop("FLASHMASK_FWD")


def check(names) -> dict:
    """Max |O diff| (relative to max |O|) and max |LSE diff| against the Triton forward, per variant."""
    from flashmask.benchmarks.bench_attention import build_mask

    worst = {n: 0.0 for n in names}
    for mask, hq, hk in (("full", 4, 4), ("causal", 4, 4), ("causal_document", 4, 4), ("causal_document", 8, 2),
                         ("document", 4, 4), ("global_sliding", 4, 4), ("share_question", 4, 4)):
        torch.manual_seed(hq)
        sri, causal = build_mask(mask, 2048, 2)
        q = torch.randn(2, 2048, hq, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(2, 2048, hk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        o_ref, lse_ref = _triton(q, k, v, sri, causal)
        fin = torch.isfinite(lse_ref)
        for n in names:
            o, lse = _gluon(q, k, v, sri, causal, VARIANTS[n])
            err_o = float((o.float() - o_ref.float()).abs().max() / o_ref.float().abs().max())
            err_l = float((lse - lse_ref)[fin].abs().max()) if fin.any() else 0.0
            same_inf = bool(torch.equal(torch.isfinite(lse), fin))
            worst[n] = max(worst[n], err_o, err_l, 0.0 if same_inf else float("inf"))
    return worst


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--masks", default="full,causal,causal_document,document,global_sliding,qk_sparse")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS))
    ap.add_argument("--check-only", action="store_true", help="only the correctness check (compiles the variants)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("gluon_fwd_ab needs an sm_90 GPU (H100 / H200): the Gluon kernels are written for Hopper")
    from flashmask.benchmarks.bench_attention import allowed_count, bench, build_mask

    names = [n for n in args.variants.split(",") if n]
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}")
    worst = check(names)
    print("check vs the Triton forward (max rel. |dO| or |dLSE|; inf = different empty rows):",
          {n: round(w, 5) for n, w in worst.items()}, flush=True)
    if args.check_only:
        return
    names = [n for n in names if worst[n] < 2e-2]
    s, b, h, d = args.seq, args.tokens // args.seq, 32, 128
    rows = []
    for mask in args.masks.split(","):
        sri, causal = build_mask(mask, s, b)
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * h * d * allowed_count(sri, causal, b, s)
        times = {"triton": []} | {n: [] for n in names}
        for _ in range(2):
            times["triton"].append(bench(lambda: _triton(q, k, v, sri, causal)))
            for n in names:
                times[n].append(bench(lambda: _gluon(q, k, v, sri, causal, VARIANTS[n])))
        ref = sum(times["triton"]) / 2
        for n, ts in times.items():
            t = sum(ts) / 2
            rows.append((mask, n, ts, flops / t / 1e9, ref / t))
        del q, k, v
    print(f"\n| mask {s} | forward | ms (round 1 / 2) | TFLOP/s | speed vs Triton |\n|---|---|---|---|---|")
    for mask, n, ts, tfs, ratio in rows:
        print(f"| {mask} | {n} | {ts[0]:.3f} / {ts[1]:.3f} | {tfs:.0f} | {ratio:.3f}x |")


if __name__ == "__main__":
    main()
