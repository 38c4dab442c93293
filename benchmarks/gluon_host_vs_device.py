"""Host-bound or not: fwd+bwd of the Triton FlashMask attention timed with ``do_bench`` (host + device) and with
``do_bench_cudagraph`` (device only), with the Gluon backward (``FLASHMASK_BWD=gluon``) and the Triton one
(``=triton``) in one process; D = 128, H = 32, bf16, 8K tokens at B = 1 and 4 (masks of ``bench_attention``).

Usage (one Hopper GPU): ``python benchmarks/gluon_host_vs_device.py``; prints one JSON line per case (ms).
Results (H200): ``docs/benchmarks.md``."""
import os, sys, torch, json
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from triton.testing import do_bench, do_bench_cudagraph
from flashmask.benchmarks.bench_attention import build_mask
from flashmask.triton_flashmask import flashmask_attention_triton

def case(name, s, b):
    sri, causal = build_mask(name, s, b)
    sri = None if sri is None else sri.cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, s, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    def step():
        out = flashmask_attention_triton(q, k, v, sri, causal, 128 ** -0.5, False)[0]
        torch.autograd.grad(out, (q, k, v), do)
    row = dict(mask=name, S=s, B=b)
    for be in ("triton", "gluon"):
        os.environ["FLASHMASK_BWD"] = be
        step(); torch.cuda.synchronize()
        row[be + "_bench_ms"] = round(do_bench(step, warmup=20, rep=200), 3)
        try:
            row[be + "_graph_ms"] = round(do_bench_cudagraph(step, rep=200), 3)
        except Exception as e:
            row[be + "_graph_ms"] = f"{type(e).__name__}: {str(e)[:120]}"
    print(json.dumps(row), flush=True)

for name in ("causal_document", "share_question", "causal", "document"):
    case(name, 8192, 1)
for name in ("causal_document", "share_question"):
    case(name, 8192, 4)
