"""Offline block-size sweep for the Triton FlashMask kernels (one CUDA GPU).

Times forward, backward with atomic dQ and backward with the deterministic dQ kernel for a small set of tile
configs (via ``FLASHMASK_FWD_CFG`` / ``FLASHMASK_BWD_CFG``) on a full and a causal-document mask, bf16,
B*S = 32K, H = 32, and prints the fastest configs as shell ``export`` lines (``--emit-env``) so that a later
command can use them. The winners are then written into ``triton_flashmask.fwd_config`` / ``bwd_config``.

Usage: ``python -m flashmask.benchmarks.tune_blocks [--seq 8192] [--head-dim 128] [--emit-env FILE]``.
"""

from __future__ import annotations

import argparse
import os

import torch
from triton.testing import do_bench

from flashmask import masks as M
from flashmask.triton_flashmask import flashmask_attention_triton

FWD = ["128,64,4,3", "128,64,8,3", "128,128,8,3", "128,128,8,2", "64,64,4,3", "128,32,4,3"]
BWD = ["32,128,4,3,128,32,4,3", "64,128,8,2,128,64,8,2", "32,64,4,3,64,64,4,3", "64,64,4,2,128,32,8,2",
       "16,128,4,3,64,32,4,3"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--emit-env", default=None, help="write 'export FLASHMASK_...=...' lines here")
    args = p.parse_args(argv)
    s, d, h = args.seq, args.head_dim, 32
    b = max(1, 32768 // s)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, s, h, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    docs = [[s // 4, s // 8, s // 2, s - s // 4 - s // 8 - s // 2]] * b
    cases = {"full": (None, False), "causal_document": (M.causal_document_mask(docs).startend_row_indices.cuda(),
                                                        True)}
    scale = d ** -0.5
    fwd_tot, bwd_tot, det_tot = {}, {}, {}
    print(f"{'kind':6} {'config':28} " + " ".join(f"{n:>16}" for n in cases), flush=True)
    for cfg in FWD:
        os.environ["FLASHMASK_FWD_CFG"] = cfg
        ts = []
        for sri, causal in cases.values():
            try:
                ts.append(do_bench(lambda: flashmask_attention_triton(q, k, v, sri, causal, scale, False),
                                   warmup=10, rep=40, return_mode="median"))
            except Exception as e:  # out of shared memory / registers for this shape
                ts.append(float("inf"))
                print(f"fwd {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        fwd_tot[cfg] = sum(ts)
        print(f"{'fwd':6} {cfg:28} " + " ".join(f"{t:16.3f}" for t in ts), flush=True)
    best_fwd = min(fwd_tot, key=fwd_tot.get)
    os.environ["FLASHMASK_FWD_CFG"] = best_fwd
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    for cfg in BWD:
        os.environ["FLASHMASK_BWD_CFG"] = cfg
        for det, tot in ((False, bwd_tot), (True, det_tot)):
            ts = []
            for sri, causal in cases.values():
                try:
                    o = flashmask_attention_triton(*leaves, sri, causal, scale, det)[0]
                    ts.append(do_bench(lambda: torch.autograd.grad(o, leaves, do, retain_graph=True),
                                       warmup=10, rep=40, return_mode="median"))
                except Exception as e:
                    ts.append(float("inf"))
                    print(f"bwd {cfg} det={det}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            tot[cfg] = sum(ts)
            print(f"{'bwd-d' if det else 'bwd-a':6} {cfg:28} " + " ".join(f"{t:16.3f}" for t in ts), flush=True)
    best_bwd = min(bwd_tot, key=bwd_tot.get)
    best_det = min(det_tot, key=det_tot.get)
    print(f"best fwd {best_fwd} ({fwd_tot[best_fwd]:.3f} ms), bwd atomic {best_bwd} ({bwd_tot[best_bwd]:.3f} ms), "
          f"bwd deterministic {best_det} ({det_tot[best_det]:.3f} ms)")
    if args.emit_env:
        # the default (non-deterministic) backward uses the atomic winner; the dQ part of the deterministic winner
        bb = best_bwd.split(",")[:4] + best_det.split(",")[4:]
        with open(args.emit_env, "w") as f:
            f.write(f"export FLASHMASK_FWD_CFG={best_fwd}\nexport FLASHMASK_BWD_CFG={','.join(bb)}\n")


if __name__ == "__main__":
    main()
