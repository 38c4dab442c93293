"""Host time of one attention call at the 1B training shape: is the kernel or the launch path the limit?

One 8K pack of ``benchmarks/e2e_train.py`` (log-normal documents), q ``[1, 8192, 32, 64]``, k / v
``[1, 8192, 8, 64]``, bf16. For the eager path (``autograd.Function``, the default for eager calls) and the custom
op path (``FLASHMASK_EAGER_OP=1``, what ``torch.compile`` sees) it prints, for the forward and the
forward+backward (``out.backward(dO)``):

- ``host``: microseconds of Python per call, measured while the GPU is busy with a queued backlog of matmuls, so the
  launches never wait for the GPU (median of 3 x 20 calls);
- ``do_bench``: ``triton.testing.do_bench`` of the call (what benchmarks usually report);
- ``gpu``: ``triton.testing.do_bench_cudagraph`` of the same kernels (device time only).

then the autograd.Function path's forward+backward once more with
``torch.autograd.set_multithreading_enabled(False)`` (the backward on the calling thread instead of the engine's
device thread), and, as a yardstick for the host, a trivial ``torch.autograd.grad`` of ``(x * 2).sum()``. When
``host`` exceeds ``gpu`` the call is host-bound and ``do_bench`` measures the host.

Usage: ``PYTHONPATH=$PWD/ops:$PWD python benchmarks/attn_host_overhead.py`` (GPU only).
Results (H200): ``docs/benchmarks.md``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_models  # noqa: E402
import e2e_train  # noqa: E402


def host_us(fn, backlog: torch.Tensor, calls: int = 20) -> float:
    """Median over 3 rounds of the host time per call (us), each round behind about 40 queued 8K matmuls."""
    rounds = []
    for _ in range(3):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        for _ in range(40):
            backlog @ backlog
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def main() -> None:
    from triton.testing import do_bench, do_bench_cudagraph

    import flashmask.triton_flashmask as T
    from flashmask import flashmask_attention

    if not torch.cuda.is_available():
        raise SystemExit("attn_host_overhead needs a CUDA GPU")
    info = e2e_models.model_config("llama1b", False)
    packs = e2e_train.build_packs(info["vocab"], 8192, 1, 0, 1.0)
    sri = e2e_train.make_batches("ours", packs, 8192, 4, "cuda")[0][0]["attn_mask_startend_row_indices"]
    g = torch.Generator(device="cuda").manual_seed(0)

    def leaf(h):
        return torch.randn(1, 8192, h, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)

    q, k, v = leaf(32), leaf(8), leaf(8)
    do = torch.randn_like(q)
    backlog = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    qd, kd, vd, scale = q.detach(), k.detach(), v.detach(), 64 ** -0.5
    mv = T._mask_vectors(sri, True, 8192, 8192, q.device)
    o, lse = T._fwd(qd, kd, vd, mv, True, scale)
    gpu = {"fwd": do_bench_cudagraph(lambda: T._fwd(qd, kd, vd, mv, True, scale), rep=100)}
    gpu["fwd+bwd"] = gpu["fwd"] + do_bench_cudagraph(
        lambda: T._bwd(do, qd, kd, vd, o, lse, None, mv, True, scale, False), rep=100)
    calls = {"fwd": lambda: flashmask_attention(q, k, v, sri, causal=True),
             "fwd+bwd": lambda: flashmask_attention(q, k, v, sri, causal=True).backward(do)}
    print(f"pack: {len(packs[0]['seq_lens'])} documents; bf16, 32 / 8 heads, D = 64, B = 1, S = 8192")
    print("path               pass      host us   do_bench ms   gpu ms")
    # (label, FLASHMASK_EAGER_OP, autograd engine threads, passes); the autograd engine runs CUDA backward nodes on
    # its own device thread, with multithreading off on the calling one (on an H200 most of the fwd+bwd host time
    # is that handoff, not our code)
    variants = [("autograd.Function", "0", True, calls), ("custom op", "1", True, calls),
                ("no engine threads", "0", False, {"fwd+bwd": calls["fwd+bwd"]})]
    old = os.environ.get("FLASHMASK_EAGER_OP")
    try:
        for label, path, threads, passes in variants:
            os.environ["FLASHMASK_EAGER_OP"] = path
            with torch.autograd.set_multithreading_enabled(threads):
                for name, fn in passes.items():
                    h = host_us(fn, backlog)
                    ms = do_bench(fn, warmup=20, rep=100, grad_to_none=[q, k, v])
                    print(f"{label:18s} {name:8s} {h:8.1f}   {ms:10.3f}   {gpu[name]:7.3f}", flush=True)
    finally:
        if old is None:
            os.environ.pop("FLASHMASK_EAGER_OP", None)
        else:
            os.environ["FLASHMASK_EAGER_OP"] = old
    x = torch.randn(16, device="cuda", requires_grad=True)
    print(f"yardstick: torch.autograd.grad((x * 2).sum()) host {host_us(lambda: torch.autograd.grad((x * 2).sum(), (x,)), backlog):.1f} us")


if __name__ == "__main__":
    main()
