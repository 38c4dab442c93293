"""Triton FlashMask on a CUDA GPU (H200): bf16/fp16, long sequences, GQA, per-head masks, builders, determinism.

Tolerance (tests/ops/tolerance.py): kernel vs an fp32 reference must be within 2x the error of the same
computation in plain PyTorch in the kernel's dtype, plus a floor. The references are computed in chunks of
query rows (softmax is row-wise, so out/LSE/dQ are exact per chunk and dK/dV are sums over chunks), which keeps
S = 16384 within memory.
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from tolerance import assert_close_to_ref  # noqa: E402

pytestmark = pytest.mark.gpu

if torch.cuda.is_available():
    torch.backends.cuda.matmul.allow_tf32 = False

MODES = [(True, None), (False, None), (True, 1), (True, 2), (False, 2), (False, 4)]


def random_sri(b, hm, s, causal, c, gen, device="cuda"):
    """Random valid vectors for a mode (same recipe as tests/ops/test_triton.py), int32 [b, hm, s, c] on CUDA."""
    r = torch.sort(torch.randint(0, s + 1, (b, hm, s, 4), generator=gen), dim=-1).values
    keep = torch.rand(b, hm, s, generator=gen) < 0.25
    if causal:
        j = torch.arange(s)
        lts = torch.maximum(r[..., 2], j + 1).clamp(max=s)
        lte = torch.maximum(r[..., 3], lts)
        lts = torch.where(keep, s, lts)
        vec = [lts] if c == 1 else [lts, torch.where(keep, s, lte)]
    elif c == 2:
        vec = [torch.where(keep, s, r[..., 2]), torch.where(keep, 0, r[..., 1])]
    else:
        uts, ute, lts, lte = r.unbind(-1)
        vec = [torch.where(keep, s, lts), lte, uts, torch.where(keep, 0, ute)]
    return torch.stack(vec, -1).to(torch.int32).to(device)


def chunked_reference(q, k, v, do, sri, causal, scale, dtype, chunk=2048):
    """Masked attention in ``dtype`` (fp32 = reference, q.dtype = same-dtype run), chunked over query rows.

    Returns (out, lse, dq, dk, dv); math identical to ``flashmask.reference`` (empty rows: 0, -inf, 0 grads).
    """
    from flashmask.dense import expand_startend

    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    g = h_q // h_k
    kc = k.detach().to(dtype).requires_grad_(True)
    vc = v.detach().to(dtype).requires_grad_(True)
    vecs = None if sri is None else expand_startend(sri, causal, s_q)  # 4 x [B, Hm, S_k] int64
    outs, lses, dqs = [], [], []
    dk = torch.zeros(b, s_k, h_k, d, dtype=torch.float32, device=q.device)
    dv = torch.zeros_like(dk)
    j = torch.arange(s_k, device=q.device)
    for a in range(0, s_q, chunk):
        e = min(a + chunk, s_q)
        qc = q[:, a:e].detach().to(dtype).requires_grad_(True)
        i = torch.arange(a, e, device=q.device)[:, None]  # [rows, 1]
        if vecs is None:
            allowed = (j[None] <= i) if causal else torch.ones(e - a, s_k, dtype=torch.bool, device=q.device)
            allowed = allowed[None, None]
        else:
            lts, lte, uts, ute = (t[:, :, None, :] for t in vecs)
            masked = ((i >= lts) & (i < lte)) | ((i >= uts) & (i < ute))
            allowed = (~masked).repeat_interleave(h_q // masked.shape[1], dim=1)  # [B, H_q, rows, S_k]
        live = allowed.any(-1, keepdim=True)
        kk = kc.transpose(1, 2).repeat_interleave(g, 1)
        vv = vc.transpose(1, 2).repeat_interleave(g, 1)
        s = (qc.transpose(1, 2) @ kk.transpose(-1, -2)) * scale
        s = s.masked_fill(~allowed, float("-inf"))
        s = torch.where(live, s, torch.zeros_like(s))
        lse = torch.logsumexp(s.float(), -1).masked_fill(~live[..., 0], float("-inf"))
        p = torch.softmax(s, -1) * live
        out = (p @ vv).transpose(1, 2)
        gq, gk, gv = torch.autograd.grad((out.float() * do[:, a:e].float()).sum(), (qc, kc, vc))
        outs.append(out.detach().to(q.dtype))
        lses.append(lse.detach().expand(b, h_q, e - a))
        dqs.append(gq.float())
        dk += gk.float()
        dv += gv.float()
    return torch.cat(outs, 1), torch.cat(lses, 2), torch.cat(dqs, 1), dk, dv


def run_kernel(q, k, v, do, sri, causal, deterministic=False):
    from flashmask import flashmask_attention

    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = flashmask_attention(q, k, v, sri, causal=causal, return_softmax_lse=True,
                                   deterministic=deterministic, impl="triton")
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    return out, lse, dq, dk, dv


def check(q, k, v, do, sri, causal, deterministic=False):
    scale = q.shape[-1] ** -0.5
    kern = run_kernel(q, k, v, do, sri, causal, deterministic)
    ref = chunked_reference(q, k, v, do, sri, causal, scale, torch.float32)
    same = chunked_reference(q, k, v, do, sri, causal, scale, q.dtype)
    report = {}
    for name, a, r, t in zip(("out", "lse", "dq", "dk", "dv"), kern, ref, same):
        report[name] = assert_close_to_ref(a, r, t, name, dtype=q.dtype)
    return kern, report


def log_result(line: str) -> None:
    """Print a result line and append it to $FLASHMASK_GPU_LOG when set (xdist captures stdout)."""
    print("\n" + line)
    path = os.environ.get("FLASHMASK_GPU_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def qkv(b, s, h_q, h_k, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h: torch.randn(b, s, h, d, generator=g, device="cuda", dtype=torch.float32).to(dtype)  # noqa: E731
    return mk(h_q), mk(h_k), mk(h_k), mk(h_q)


CASES = list(itertools.product([torch.bfloat16, torch.float16], [1, 63, 128, 129, 1000, 4096, 16384], [64, 128, 256]))


@pytest.mark.parametrize("idx", range(len(CASES)),
                         ids=[f"{str(c[0])[6:]}-S{c[1]}-D{c[2]}-{'causal' if MODES[i % 6][0] else 'full'}"
                              f"C{MODES[i % 6][1]}" for i, c in enumerate(CASES)])
def test_random_masks_gpu(idx):
    """Each (dtype, S, D) with a mode cycling over all 6; GQA and per-head masks at S <= 4096."""
    dtype, s, d = CASES[idx]
    causal, c = MODES[idx % 6]
    b, h_q, h_k = (2, 4, 2) if s <= 4096 else (1, 2, 1)
    hm = h_k if (c or 0) % 2 == 0 else 1
    gen = torch.Generator().manual_seed(idx)
    sri = None if c is None else random_sri(b, hm, s, causal, c, gen)
    q, k, v, do = qkv(b, s, h_q, h_k, d, dtype, idx)
    _, rep = check(q, k, v, do, sri, causal)
    log_result(f"RESULT {dtype} S={s} D={d} mode={causal},{c}: " +
          " ".join(f"{n}={r['max_err']:.2e}/{r['budget']:.2e}" for n, r in rep.items()))


def _builder_masks(s):
    from flashmask import masks

    return {
        "causal_document": masks.causal_document_mask([[1000, 1500, s - 2500], [s]]),
        "document": masks.document_mask([[700, s - 700], [100, 2000, s - 2100]]),
        "share_question": masks.share_question_mask([[(500, [300, 700, 524])], [(1000, [1000, 976]), (24, [0])]],
                                                    seq_len=s),
        "sliding_window": masks.sliding_window_mask(s, 512, batch_size=2),
        "global_sliding": masks.global_sliding_window_mask(s, 16, (256, 256), batch_size=2),
        "prefix_lm_causal": masks.prefix_lm_causal_mask(s, 1024, batch_size=2),
        "prefix_lm_document": masks.prefix_lm_document_mask([[1024, s - 1024], [s]], [[100, 700], [2000]]),
        "causal_blockwise": masks.causal_blockwise_mask([[1000, 1000, s - 2000], [s // 2, s // 2]]),
        "qk_sparse": masks.qk_sparse_mask(s, [(300, 900), (2000, 2100)], batch_size=2),
        "random_eviction_per_head": masks.random_eviction_mask(s, 0.5, num_heads=2, batch_size=2, seed=3),
    }


@pytest.mark.parametrize("name", ["causal_document", "document", "share_question", "sliding_window",
                                  "global_sliding", "prefix_lm_causal", "prefix_lm_document", "causal_blockwise",
                                  "qk_sparse", "random_eviction_per_head"])
def test_mask_builders_gpu(name):
    pytest.importorskip("flashmask.masks")
    s = 3000
    m = _builder_masks(s)[name]
    sri = m.startend_row_indices.cuda()
    q, k, v, do = qkv(2, s, 4, 2, 128, torch.bfloat16, hash(name) % 1000)
    _, rep = check(q, k, v, do, sri, m.causal)
    log_result(f"RESULT builder {name}: " + " ".join(f"{n}={r['max_err']:.2e}/{r['budget']:.2e}" for n, r in rep.items()))


@pytest.mark.parametrize("causal,c,d", [(False, 4, 128), (True, 1, 64), (True, 2, 256)])
def test_deterministic_20_runs_bitwise(causal, c, d):
    """deterministic=True: 20 runs give bitwise-identical out, lse, dq, dk, dv (and match the reference)."""
    s = 1000
    sri = random_sri(2, 2, s, causal, c, torch.Generator().manual_seed(5))
    q, k, v, do = qkv(2, s, 4, 2, d, torch.bfloat16, 5)
    first, _ = check(q, k, v, do, sri, causal, deterministic=True)
    for _ in range(19):
        again = run_kernel(q, k, v, do, sri, causal, deterministic=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_dp_first_other_order_gpu(d, monkeypatch):
    """The backward's non-default product order (``launch_config.dp_first``) at each tuned head dim: within the
    reference tolerances and bitwise equal to the default order (only the issue order of dP = dO V^T differs)."""
    from flashmask import triton_launch

    s = 1000
    sri = random_sri(2, 2, s, True, 2, torch.Generator().manual_seed(9))
    q, k, v, do = qkv(2, s, 4, 2, d, torch.bfloat16, 9)
    default = run_kernel(q, k, v, do, sri, True)
    monkeypatch.setattr(triton_launch, "dp_first", lambda d_pad: d_pad == 128)  # the other order at each dim
    other, _ = check(q, k, v, do, sri, True)
    for a, b in zip(default, other):
        assert torch.equal(a, b)
