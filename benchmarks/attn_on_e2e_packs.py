"""Our attention vs FlexAttention on the masks of the end-to-end benchmark's packs (issue 8/9 cross-check).

The kernel benchmark (ops/flashmask/benchmarks/bench_attention.py) draws its own document lengths; this times the
real packs of ``benchmarks/e2e_train.py`` (log-normal lengths, 1B shape: 32 query / 8 KV heads, D = 64, one 8K pack)
through ``flashmask_attention`` and through the e2e flex backend (eagerly, and inside a ``torch.compile``d function,
where the BlockMask is built in the graph). ``triton.testing.do_bench`` medians, ms. GPU only.

Usage: ``PYTHONPATH=$PWD/ops:$PWD python benchmarks/attn_on_e2e_packs.py``
Result (H200, 2026-11-30): ``benchmarks/results/attn_on_e2e_packs_h200.log``.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_models  # noqa: E402
import e2e_train  # noqa: E402


def main(n_packs: int = 2) -> None:
    from triton.testing import do_bench

    from flashmask import flashmask_attention

    if not torch.cuda.is_available():
        raise SystemExit("attn_on_e2e_packs needs a CUDA GPU")
    for knob in ("recompile_limit", "cache_size_limit"):  # one flex compile per pack's mask_mod
        setattr(torch._dynamo.config, knob, 64)
    info = e2e_models.model_config("llama1b", False)
    packs = e2e_train.build_packs(info["vocab"], 8192, n_packs + 1, 0, 1.0)
    batches = e2e_train.make_batches("ours", packs, 8192, 4, "cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    flex = e2e_train.flex_attention_backend
    for bi in range(n_packs):
        sri = batches[bi][0]["attn_mask_startend_row_indices"]  # int32 [1, 1, 8192, 1]
        lens = packs[bi]["seq_lens"]
        density = sum(n * (n + 1) / 2 for n in lens) / 8192 ** 2

        def leaf(h):  # [1, 8192, h, 64] bf16
            return torch.randn(1, 8192, h, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)

        q, k, v = leaf(32), leaf(8), leaf(8)
        do = torch.randn_like(q)
        compiled_flex = torch.compile(lambda q, k, v, s: flex(q, k, v, s, True))
        fns = {"ours": lambda: flashmask_attention(q, k, v, sri, causal=True),
               "flex_eager_wrapper": lambda: flex(q, k, v, sri, True),
               "flex_in_compiled_fn": lambda: compiled_flex(q, k, v, sri)}
        ref = fns["ours"]()
        for name, f in fns.items():
            err = (f().float() - ref.float()).abs().max().item()
            fwd = do_bench(f, warmup=20, rep=100)
            fb = do_bench(lambda: f().backward(do), warmup=20, rep=100, grad_to_none=[q, k, v])
            print(f"pack {bi} docs {len(lens)} density {density:.4f} {name:22s} fwd {fwd:.3f} ms fwd+bwd {fb:.3f} ms "
                  f"maxdiff {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
