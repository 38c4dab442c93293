"""Our attention vs FlexAttention on the masks of the end-to-end benchmark's packs.

The kernel benchmark (ops/flashmask/benchmarks/bench_attention.py) draws its own document lengths; this times the
real packs of ``benchmarks/e2e_train.py`` (log-normal lengths, 1B shape: 32 query / 8 KV heads, D = 64, one 8K pack
per call, B = 1) through ``flashmask_attention`` and through the e2e flex backend inside a ``torch.compile``d
function (how the e2e ``flex`` setup with compiled layers runs it: the BlockMask is built in the graph).

Two timings per pack and side, fwd+bwd (``out.backward(dO)``), ms:
- ``wall``: ``triton.testing.do_bench`` of the call as a user makes it. At this size the host can be the limit
  (H200 host: a trivial ``autograd.grad`` costs about 0.16 ms), so this includes launch overhead.
- ``gpu``: ``triton.testing.do_bench_cudagraph`` of the same work: device time only. For ours the mask
  preprocessing is done once outside the graph (as the per-index-tensor cache does in training) and the
  kernels are called directly; for flex the compiled function is captured whole (its in-graph BlockMask build
  included, as in the e2e setup).

Usage: ``PYTHONPATH=$PWD/ops:$PWD python benchmarks/attn_on_e2e_packs.py [n_packs]`` (GPU only; default 12).
Results (H200): ``docs/benchmarks.md``.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_models  # noqa: E402
import e2e_train  # noqa: E402


def main(n_packs: int = 12) -> None:
    from triton.testing import do_bench, do_bench_cudagraph

    import flashmask.triton_flashmask as T
    from flashmask import flashmask_attention

    if not torch.cuda.is_available():
        raise SystemExit("attn_on_e2e_packs needs a CUDA GPU")
    for knob in ("recompile_limit", "cache_size_limit"):  # one flex compile per pack's mask_mod
        setattr(torch._dynamo.config, knob, 64)
    info = e2e_models.model_config("llama1b", False)
    packs = e2e_train.build_packs(info["vocab"], 8192, n_packs, 0, 1.0)
    batches = e2e_train.make_batches("ours", packs, 8192, 4, "cuda")
    g = torch.Generator(device="cuda").manual_seed(0)

    def leaf(h):  # [1, 8192, h, 64] bf16
        return torch.randn(1, 8192, h, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)

    q, k, v = leaf(32), leaf(8), leaf(8)
    do = torch.randn_like(q)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    scale = 64 ** -0.5
    compiled_flex = torch.compile(lambda q, k, v, s: e2e_train.flex_attention_backend(q, k, v, s, True))
    print("fwd+bwd ms; wall = do_bench of the call, gpu = CUDA-graph device time; ratio = flex / ours")
    print("pack docs longest density | ours wall   gpu | flex wall   gpu | ratio wall  gpu | maxdiff")
    sums = [0.0] * 4
    for bi in range(n_packs):
        sri = batches[bi][0]["attn_mask_startend_row_indices"]  # int32 [1, 1, 8192, 1]
        lens = packs[bi]["seq_lens"]
        density = sum(n * (n + 1) / 2 for n in lens) / 8192 ** 2
        ours = lambda: flashmask_attention(q, k, v, sri, causal=True)  # noqa: E731
        flex = lambda: compiled_flex(q, k, v, sri)  # noqa: E731
        err = (flex().float() - ours().float()).abs().max().item()
        mv = T._mask_vectors(sri, True, 8192, 8192, q.device)
        o, lse = T._fwd(qd, kd, vd, mv, True, scale)

        def ours_gpu():
            T._fwd(qd, kd, vd, mv, True, scale)
            T._bwd(do, qd, kd, vd, o, lse, None, mv, True, scale, False)

        row = [do_bench(lambda: ours().backward(do), warmup=20, rep=100, grad_to_none=[q, k, v]),
               do_bench_cudagraph(ours_gpu, rep=100),
               do_bench(lambda: flex().backward(do), warmup=20, rep=100, grad_to_none=[q, k, v]),
               do_bench_cudagraph(lambda: torch.autograd.grad(flex(), (q, k, v), do), rep=100)]
        sums = [a + b for a, b in zip(sums, row)]
        print(f"{bi:4d} {len(lens):4d} {max(lens):7d} {density:7.4f} | {row[0]:6.3f} {row[1]:6.3f} | "
              f"{row[2]:6.3f} {row[3]:6.3f} | {row[2] / row[0]:5.2f}x {row[3] / row[1]:5.2f}x | {err:.1e}", flush=True)
    print(f" sum of {n_packs} packs          | {sums[0]:6.2f} {sums[1]:6.2f} | {sums[2]:6.2f} {sums[3]:6.2f} | "
          f"{sums[2] / sums[0]:5.2f}x {sums[3] / sums[1]:5.2f}x |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
