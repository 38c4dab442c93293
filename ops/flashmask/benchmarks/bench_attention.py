"""Kernel benchmark: Triton FlashMask vs FlexAttention (Triton backend) vs SDPA, on one CUDA GPU.

Times (median ms over at least 10 calls, ``triton.testing.do_bench``) the forward and forward+backward of
- ours: ``flashmask.autograd.flashmask_attention_triton`` (the kernel ``flashmask_attention`` runs on CUDA, with the
  default ``FLASHMASK_FWD`` / ``FLASHMASK_BWD``). Its mask preprocessing (block min/max and
  the visit lists of the three launches) is cached on the index tensor after the first call, as in training where
  every layer of a batch reuses it; like flex's BlockMask it is timed separately ("build ms ours / flex");
- flex: ``torch.compile(flex_attention)`` with a BlockMask from ``torch.compile(create_block_mask)`` over a
  mask_mod that reads the same FlashMask vectors (exact same mask; build time reported separately);
- sdpa-cudnn / sdpa-flash: ``F.scaled_dot_product_attention`` on causal / full only;
- sdpa-dense: SDPA with a dense bool mask ``[B, 1, S, S]`` (only at the smallest S, where it fits comfortably).
Outputs of flex (and SDPA where run) are compared with ours before timing. TFLOP/s count only the allowed
(unmasked) score elements: fwd 4*D*allowed*H, fwd+bwd 3.5x that (bwd = 2.5 x fwd), flashmask.md §3.7.
FlexAttention compiles once per mask and length: dynamo's recompile limits are raised so that every row runs
compiled (at the default limit of 8 it falls back to its unfused path, which runs out of memory at 16K).

``causal`` is timed twice: ``causal [None]`` passes ``startend_row_indices=None`` (our no-mask fast path) and
``causal [LTS=S]`` an all-``S`` LTS vector, the same mask given as vectors (what FlashMask V3 is timed with).

``--v3`` runs the setting of FlashMask V3's same-run table (one H200, 2026-12-03; docs/kernel_notes.md: B = 1,
H = 32, D = 128, bf16, its six masks at 8K and 16K, vectors on both sides; also ``causal [None]``) and
prints, per row, our speed over FlexAttention beside V3's speed over FlexAttention from that run (``V3_OVER_FLEX``)
and the ratio of the two: V3 cannot run here, so its same-run ratio to FlexAttention is the bar. It times as
that run did: ``do_bench(warmup=25, rep=150)`` medians, two rounds with the kernels' order reversed in the second,
each kernel's minimum kept (``--rounds``, ``--warmup-ms``, ``--rep-ms`` set the same for any run). With
``--head-dim`` / ``--heads`` / ``--kv-heads`` it runs the same masks at another shape (V3 columns empty).

Also: the bf16 matmul rate (8192^3 GEMM) measured in the same run, mask memory (ours: the int32 index tensor;
flex: the BlockMask's tensors; dense: the bool mask), and a summary with the geometric mean and the worst mask of
the fwd+bwd speedup over flex, the causal ratio to cuDNN and the forward causal rate as a share of the matmul rate.
``--memory-seq 131072`` adds one long causal-document case (B=1): time and peak memory, ours vs flex.

Usage: ``python -m flashmask.benchmarks.bench_attention [--seqs 8192,16384,32768] [--tokens 32768]
[--masks causal,document,...] [--head-dim 128] [--memory-seq 131072] [--out results.jsonl]``, or
``python -m flashmask.benchmarks.bench_attention --v3 [--head-dim 64 --kv-heads 8] [--out v3.jsonl]``. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from flashmask import masks as M
from flashmask.dense import expand_startend
from flashmask.autograd import flashmask_attention_triton

MASKS = ["causal", "causal_vec", "full", "causal_document", "share_question", "sliding_window_1024", "prefix_lm_causal",
         "document", "global_sliding", "causal_blockwise", "qk_sparse", "random_eviction"]


def doc_lengths(s: int, b: int, seed: int, kind: str = "lognormal") -> list[list[int]]:
    """Per sample, document lengths summing to S.

    ``lognormal`` (default): token-granular lengths from the end-to-end benchmark's chat-example distribution,
    LogNormal(ln 661, 0.985) clipped to [16, S] (``benchmarks/e2e_train.py``), drawn until they fill S; the last
    one is cut to fit. ``aligned64``: 3..7 documents (x2 from 16K) with boundaries on multiples of 64, which never
    cut a 64-wide tile (no partial tiles off the diagonal for 64-key tiles): it flatters block-sparse kernels with
    small tiles.
    """
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(b):
        if kind == "aligned64":
            n = int(torch.randint(3, 8, (1,), generator=g)) * max(1, min(2, s // 8192))
            cuts = torch.sort(torch.randperm(s // 64 - 1, generator=g)[: n - 1] + 1).values * 64
            edges = [0] + cuts.tolist() + [s]
            rows.append([edges[i + 1] - edges[i] for i in range(n)])
            continue
        lens, left = [], s
        while left > 0:
            n = int(torch.empty(1).log_normal_(math.log(661.0), 0.985, generator=g).round().clamp(16, s))
            lens.append(min(n, left))
            left -= lens[-1]
        rows.append(lens)
    return rows


def build_mask(name: str, s: int, b: int, docs_kind: str = "lognormal"):
    """(startend_row_indices or None, causal) for a benchmark mask at sequence length s, batch b."""
    docs = doc_lengths(s, b, seed=s + b, kind=docs_kind)
    if name == "causal":
        return None, True
    if name == "causal_vec":  # the causal mask as an all-S LTS vector: no extra masking, the vectors are read
        return torch.full((b, 1, s, 1), s, dtype=torch.int32).cuda(), True
    if name == "full":
        return None, False
    if name == "causal_document":
        m = M.causal_document_mask(docs)
    elif name == "document":
        m = M.document_mask(docs)
    elif name == "share_question":
        rows = []
        for r, lens in enumerate(docs):
            row = []
            for i, L in enumerate(lens):  # prompt = 40 %, then 2..4 answers
                k = 2 + (r + i) % 3
                p = int(L * 0.4)
                a = [(L - p) // k] * k
                a[-1] += L - p - sum(a)
                row.append((p, a))
            rows.append(row)
        m = M.share_question_mask(rows, seq_len=s)
    elif name == "sliding_window_1024":
        m = M.sliding_window_mask(s, 1024, batch_size=b)
    elif name == "prefix_lm_causal":
        m = M.prefix_lm_causal_mask(s, s // 2, batch_size=b)
    elif name == "global_sliding":
        m = M.global_sliding_window_mask(s, 64, (512, 512), batch_size=b)
    elif name == "causal_blockwise":
        m = M.causal_blockwise_mask(docs)
    elif name == "qk_sparse":
        m = M.qk_sparse_mask(s, [(s // 8, s // 4), (s // 2, s // 2 + s // 8)], batch_size=b)
    elif name == "random_eviction":
        m = M.random_eviction_mask(s, 0.5, num_heads=1, batch_size=b, seed=1)
    else:
        raise ValueError(f"unknown mask {name!r}; choose from {MASKS}")
    return m.startend_row_indices.cuda(), m.causal


LABELS = {"causal": "causal [None]", "causal_vec": "causal [LTS=S]"}

# FlashMask V3's same-run speed over FlexAttention (V3 ms / flex ms inverted: > 1 = V3 faster), (forward,
# forward+backward), from the same-run table of FlashMask V3, FlexAttention and ours (one H200, 2026-12-03, B = 1,
# H = 32, D = 128, bf16, vectors on both sides; docs/kernel_notes.md); the rows that run has
V3_OVER_FLEX = {
    ("causal_vec", 8192): (1.33, 1.45), ("v3_causal_document", 8192): (1.39, 1.52),
    ("v3_sliding_window_1024", 8192): (1.37, 1.44), ("v3_prefix_lm_1/4", 8192): (1.31, 1.44),
    ("v3_share_question", 8192): (1.39, 1.41), ("v3_document_bidir", 8192): (1.30, 1.47),
    ("causal_vec", 16384): (1.35, 1.46), ("v3_causal_document", 16384): (1.41, 1.50),
}
V3_MASKS = ["causal", "causal_vec", "v3_causal_document", "v3_sliding_window_1024", "v3_prefix_lm_1/4",
            "v3_share_question", "v3_document_bidir"]
V3_SEQS = [8192, 16384]


def v3_doc_lengths(s: int) -> list[int]:
    """The reference's documents: ``torch.randint(256, 2048, (1,))`` from a generator seeded 1, drawn until they
    fill ``s``; the last one cut to fit."""
    g = torch.Generator().manual_seed(1)
    lens, left = [], s
    while left > 0:
        lens.append(min(int(torch.randint(256, 2048, (1,), generator=g)), left))
        left -= lens[-1]
    return lens


def build_v3_mask(name: str, s: int):
    """(startend_row_indices [1, 1, s, C] int32 on CUDA or None, causal) for a mask of the V3 reference, B = 1.

    ``causal`` / ``causal_vec`` as :func:`build_mask`; ``v3_causal_document``: LTS_j = end of j's document;
    ``v3_sliding_window_1024``: LTS_j = min(j + 1024, s) (query i sees keys i - 1023 .. i); ``v3_prefix_lm_1/4``:
    non-causal, LTS = s, UTE_j = 0 for j < s/4 else j; ``v3_share_question``: a prompt of s/4 tokens (LTS = s) and
    three answers of (s - s/4)/3 tokens (the last takes the remainder; LTS = end of the answer);
    ``v3_document_bidir``: non-causal, LTS_j = end and UTE_j = start of j's document (the same documents).
    """
    if name in ("causal", "causal_vec"):
        return build_mask(name, s, 1)
    j = torch.arange(s)
    if name in ("v3_causal_document", "v3_document_bidir"):
        lens = torch.tensor(v3_doc_lengths(s))
        end = torch.repeat_interleave(torch.cumsum(lens, 0), lens)
        vec = [end] if name == "v3_causal_document" else [end, end - torch.repeat_interleave(lens, lens)]
        causal = name == "v3_causal_document"
    elif name == "v3_sliding_window_1024":
        vec, causal = [torch.clamp(j + 1024, max=s)], True
    elif name == "v3_prefix_lm_1/4":
        vec, causal = [torch.full_like(j, s), torch.where(j < s // 4, 0, j)], False
    elif name == "v3_share_question":
        p = s // 4
        ans = [(s - p) // 3] * 3
        ans[-1] += s - p - sum(ans)
        lens = torch.tensor(ans)
        ends = torch.repeat_interleave(p + torch.cumsum(lens, 0), lens)
        vec, causal = [torch.cat([torch.full((p,), s), ends])], True
    else:
        raise ValueError(f"unknown V3 mask {name!r}; choose from {V3_MASKS}")
    return torch.stack(vec, -1).to(torch.int32)[None, None].cuda(), causal


def allowed_count(sri, causal: bool, b: int, s: int) -> int:
    """Exact number of allowed (query, key) pairs summed over the batch (per head)."""
    if sri is None:
        return b * (s * (s + 1) // 2 if causal else s * s)
    lts, lte, uts, ute = (t.long() for t in expand_startend(sri, causal, s))
    l1 = (lte - lts).clamp(min=0)
    l2 = (ute - uts).clamp(min=0)
    ov = (torch.minimum(lte, ute) - torch.maximum(lts, uts)).clamp(min=0)
    masked = l1 + l2 - torch.where((l1 > 0) & (l2 > 0), ov, torch.zeros_like(ov))
    return int((s - masked).sum()) // sri.shape[1]  # per head


class FlexMask:
    """FlexAttention mask_mod over FlashMask vectors held in fixed buffers (refilled per mask: no recompile)."""

    def __init__(self, b: int, s: int):
        self.b, self.s = b, s
        # four flat 1-D buffers: 2-D indexing inside mask_mod is slower (torchtitan PR #2171)
        self.vec = [torch.zeros(b * s, dtype=torch.int32, device="cuda") for _ in range(4)]
        lts, lte, uts, ute = self.vec
        seq = s

        def mask_mod(bi, hi, qi, ki):
            idx = bi * seq + ki
            m1 = (qi >= lts[idx]) & (qi < lte[idx])
            m2 = (qi >= uts[idx]) & (qi < ute[idx])
            return ~(m1 | m2)

        self.mask_mod = mask_mod
        from torch.nn.attention.flex_attention import create_block_mask

        self.create = torch.compile(create_block_mask)

    def block_mask(self, sri, causal: bool):
        b, s = self.b, self.s
        if sri is None:
            j = torch.arange(s, device="cuda")
            full = torch.full((b, s), s, device="cuda")
            zero = torch.zeros((b, s), device="cuda", dtype=torch.long)
            vecs = (full, full, zero, j.expand(b, s) if causal else zero)
        else:
            vecs = tuple(t[:, 0] for t in expand_startend(sri, causal, s))
        for i, t in enumerate(vecs):
            self.vec[i].copy_(t.reshape(-1).to(torch.int32))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        bm = self.create(self.mask_mod, b, None, s, s, device="cuda")
        torch.cuda.synchronize()
        return bm, (time.perf_counter() - t0) * 1e3


def ours_build_ms(sri, causal: bool, s: int, d: int) -> float:
    """Wall ms of our per-batch mask preprocessing on a fresh copy of ``sri`` (no cache): ``MaskVectors`` plus
    the visit lists of the forward, dK/dV and dQ launches at the default bf16 tiles; median of 5, synchronised."""
    from flashmask.launch_config import bwd_config, fwd_config
    from flashmask.launch_config import pow2 as _pow2
    from flashmask.triton_prep import MaskVectors

    times = []
    for _ in range(5):
        fresh = None if sri is None else sri.clone()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mv = MaskVectors(fresh, causal, s, s, torch.device("cuda"))
        fw = fwd_config(_pow2(d), torch.bfloat16, True, mv.has_uts)
        bw = bwd_config(_pow2(d), torch.bfloat16, True)
        mv.block_lists(fw["BLOCK_M"], fw["BLOCK_N"], False)
        mv.block_lists(bw["BLOCK_M"], bw["BLOCK_N"], True)
        mv.block_lists(bw["DQ_BLOCK_M"], bw["DQ_BLOCK_N"], False)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[2]


def bench(fn, grads=None, min_samples: int = 10, warmup: float = 10, rep: float = 50) -> float:
    """Median ms of ``fn`` over at least ``min_samples`` timed calls: ``do_bench`` with a ``rep`` ms budget takes
    one sample of a call longer than ``rep / 2`` (``full`` at 32K: about 130 ms; one sample read 138 ms where 20
    give 127), so the budget grows with the call."""
    from triton.testing import do_bench

    ms = do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grads, return_mode="median")
    # do_bench takes int(rep / estimate) samples, its estimate including the L2 flush before each call: a budget of
    # min_samples + 2 calls keeps that at >= min_samples for calls of more than 5 flush times (about 0.5 ms)
    if ms * (min_samples + 2) > rep:
        ms = do_bench(fn, warmup=warmup, rep=ms * (min_samples + 2), grad_to_none=grads, return_mode="median")
    return ms


def bench_rounds(cases: list, rounds: int, warmup: float, rep: float) -> dict:
    """``{key: ms}``: each ``(key, fn, grads)`` case's minimum of :func:`bench` over ``rounds`` rounds, the order
    of the cases reversed every other round, so that no kernel always runs after the same one (FlashMask V3's
    same-run method: ``warmup=25, rep=150``, two rounds)."""
    best: dict = {}
    for r in range(rounds):
        for key, fn, grads in cases if r % 2 == 0 else cases[::-1]:
            ms = bench(fn, grads, warmup=warmup, rep=rep)
            best[key] = min(ms, best.get(key, ms))
    return best


def run(args) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import flex_attention

    raise_recompile_limits()
    flex = torch.compile(flex_attention, dynamic=False)
    h, d, dt = args.heads, args.head_dim, torch.bfloat16
    hk = args.kv_heads or h
    gqa = {"enable_gqa": True} if hk != h else {}  # flex and SDPA broadcast the KV heads over their query groups
    scale = d ** -0.5
    results = []
    for s in args.seqs:
        b = max(1, args.tokens // s)
        g = torch.Generator(device="cuda").manual_seed(s)
        q, k, v, do = (torch.randn(b, s, n, d, generator=g, device="cuda", dtype=dt) for n in (h, hk, hk, h))
        qt, kt, vt, dot = (t.transpose(1, 2).contiguous() for t in (q, k, v, do))  # [B, H, S, D] for baselines
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        leaves_t = [t.clone().requires_grad_(True) for t in (qt, kt, vt)]
        fm = FlexMask(b, s)
        for name in args.masks:
            sri, causal = build_v3_mask(name, s) if args.v3 else build_mask(name, s, b, args.docs)
            n_allowed = allowed_count(sri, causal, b, s)
            fl = 4.0 * d * h * n_allowed
            row = dict(mask=name, S=s, B=b, H=h, H_kv=hk, D=d, docs=args.docs, density=n_allowed / (b * s * s))
            row["ours_mask_bytes"] = 0 if sri is None else sri.numel() * sri.element_size()
            row["dense_mask_bytes"] = b * s * s  # [B, 1, S, S] bool

            def ours_f():
                return flashmask_attention_triton(q, k, v, sri, causal, scale, False)[0]

            def ours_fb():
                o = flashmask_attention_triton(*leaves, sri, causal, scale, False)[0]
                o.backward(do)

            ref = ours_f()
            row["ours_build_ms"] = ours_build_ms(sri, causal, s, d)
            bm, row["flex_build_ms_first"] = fm.block_mask(sri, causal)
            bm, row["flex_build_ms"] = fm.block_mask(sri, causal)
            row["flex_mask_bytes"] = block_mask_bytes(bm)
            if name == "full":
                bm = None
            fo = flex(qt, kt, vt, block_mask=bm, scale=scale, **gqa)
            row["flex_vs_ours_maxdiff"] = float((fo.transpose(1, 2).float() - ref.float()).abs().max())

            def flex_f():
                return flex(qt, kt, vt, block_mask=bm, scale=scale, **gqa)

            def flex_fb():
                flex(*leaves_t, block_mask=bm, scale=scale, **gqa).backward(dot)

            row.update(bench_rounds([("ours_fwd_ms", ours_f, None), ("ours_fb_ms", ours_fb, leaves),
                                     ("flex_fwd_ms", flex_f, None), ("flex_fb_ms", flex_fb, leaves_t)],
                                    args.rounds, args.warmup_ms, args.rep_ms))

            if sri is None:
                for tag, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                    try:
                        with sdpa_kernel(be):
                            so = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale, **gqa)
                            row[f"sdpa_{tag}_vs_ours_maxdiff"] = float(
                                (so.transpose(1, 2).float() - ref.float()).abs().max())
                            row[f"sdpa_{tag}_fwd_ms"] = bench(
                                lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale,
                                                                       **gqa))

                            def sd_fb():
                                F.scaled_dot_product_attention(*leaves_t, is_causal=causal, scale=scale,
                                                               **gqa).backward(dot)

                            row[f"sdpa_{tag}_fb_ms"] = bench(sd_fb, leaves_t)
                    except RuntimeError as e:  # backend not available for this shape/build
                        row[f"sdpa_{tag}_error"] = str(e).splitlines()[0][:120]
            if s <= args.dense_max_s:
                from flashmask.dense import to_dense

                dense = to_dense(sri, causal, seq_q=s, seq_k=s).cuda()  # [B|1, 1, S, S] bool
                so = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=dense, scale=scale, **gqa)
                live = dense.any(-1)[:, 0]  # [B|1, S]: empty rows give NaN in SDPA, 0 in ours
                diff = (so.transpose(1, 2).float() - ref.float()).abs()
                row["sdpa_dense_vs_ours_maxdiff"] = float(diff[live.expand(b, s)].max())
                row["sdpa_dense_fwd_ms"] = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=dense,
                                                                                        scale=scale, **gqa))

                def dn_fb():
                    F.scaled_dot_product_attention(*leaves_t, attn_mask=dense, scale=scale, **gqa).backward(dot)

                row["sdpa_dense_fb_ms"] = bench(dn_fb, leaves_t)
                del dense
            for key in list(row):
                if key.endswith("_fwd_ms"):
                    row[key.replace("_ms", "_tflops")] = fl / row[key] * 1e-9
                elif key.endswith("_fb_ms"):
                    row[key.replace("_ms", "_tflops")] = 3.5 * fl / row[key] * 1e-9
            results.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return results


def raise_recompile_limits(limit: int = 1024) -> None:
    """Raise dynamo's recompile limits (``recompile_limit`` / ``cache_size_limit``, whichever this torch has, and
    their ``accumulated_`` totals) to at least ``limit``: compiled FlexAttention recompiles per mask and length, and
    past the limit (8 by default) it runs its unfused path, with ``[B, H, S, S]`` scores."""
    cfg = torch._dynamo.config
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, knob):
            setattr(cfg, knob, max(limit, getattr(cfg, knob)))


def block_mask_bytes(bm) -> int:
    """Bytes held by a BlockMask's tensors (block counts and indices, both directions)."""
    return sum(t.numel() * t.element_size() for t in vars(bm).values() if isinstance(t, torch.Tensor))


def matmul_tflops(n: int = 8192) -> float:
    """bf16 ``[n, n] @ [n, n]`` rate in TFLOP/s (the compute roof the attention rates are compared with)."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return 2 * n ** 3 / bench(lambda: a @ b) * 1e-9


def memory_case(args, s: int) -> dict:
    """One causal-document pack of ``s`` tokens (B=1): fwd+bwd ms and peak GiB, ours vs flex."""
    from torch.nn.attention.flex_attention import flex_attention

    h, d = args.heads, args.head_dim
    sri, causal = build_mask("causal_document", s, 1)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(1, s, h, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    row = dict(mask="causal_document", S=s, B=1, H=h, D=d, ours_mask_bytes=sri.numel() * 4)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

    def ours_fb():
        flashmask_attention_triton(*leaves, sri, causal, d ** -0.5, False)[0].backward(do)

    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    row["ours_fb_ms"] = bench(ours_fb, leaves)
    row["ours_peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    flex = torch.compile(flex_attention, dynamic=False)
    fm = FlexMask(1, s)
    bm, row["flex_build_ms_first"] = fm.block_mask(sri, causal)
    row["flex_mask_bytes"] = block_mask_bytes(bm)
    qt, kt, vt, dot = (t.transpose(1, 2).contiguous() for t in (q, k, v, do))
    leaves_t = [t.clone().requires_grad_(True) for t in (qt, kt, vt)]

    def flex_fb():
        flex(*leaves_t, block_mask=bm, scale=d ** -0.5).backward(dot)

    try:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        row["flex_fb_ms"] = bench(flex_fb, leaves_t)
        row["flex_peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    except Exception as e:  # noqa: BLE001  (OOM or compile failure is a result here)
        row["flex_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    row["dense_mask_bytes"] = s * s
    return row


def summary(results: list[dict], mm: float) -> str:
    """Geometric mean / worst fwd+bwd speedup over flex, cuDNN causal ratios, forward causal vs matmul."""
    rows = [r for r in results if "flex_fb_ms" in r and "ours_fwd_ms" in r]
    out = [f"bf16 matmul (8192^3): {mm:.0f} TFLOP/s"]
    for s in sorted({r["S"] for r in rows}):
        sub = [r for r in rows if r["S"] == s]
        fb = [r["flex_fb_ms"] / r["ours_fb_ms"] for r in sub]
        fw = [r["flex_fwd_ms"] / r["ours_fwd_ms"] for r in sub]
        worst = min(sub, key=lambda r: r["flex_fb_ms"] / r["ours_fb_ms"])
        out.append(f"S={s}: fwd+bwd vs flex geomean {math.exp(sum(map(math.log, fb)) / len(fb)):.3f}x, worst "
                   f"{worst['mask']} {worst['flex_fb_ms'] / worst['ours_fb_ms']:.2f}x; fwd geomean "
                   f"{math.exp(sum(map(math.log, fw)) / len(fw)):.3f}x")
        for r in sub:
            if r["mask"] == "causal" and "sdpa_cudnn_fb_ms" in r:  # cuDNN takes no vectors: the None row
                out.append(f"S={s} causal: ours/cuDNN speed fwd {r['sdpa_cudnn_fwd_ms'] / r['ours_fwd_ms']:.2f}x, "
                           f"fwd+bwd {r['sdpa_cudnn_fb_ms'] / r['ours_fb_ms']:.2f}x; ours fwd "
                           f"{r['ours_fwd_tflops']:.0f} TFLOP/s = {r['ours_fwd_tflops'] / mm:.0%} of matmul")
    allfb = [r["flex_fb_ms"] / r["ours_fb_ms"] for r in rows]
    if allfb:
        out.append(f"all rows: fwd+bwd vs flex geomean {math.exp(sum(map(math.log, allfb)) / len(allfb)):.3f}x, "
                   f"min {min(allfb):.2f}x, rows >= 1.1x: {sum(x >= 1.1 for x in allfb)}/{len(allfb)}")
    return "\n".join(out)


def table(results: list[dict]) -> str:
    """Markdown table: ms and TFLOP/s of ours vs flex (and SDPA) per mask and S."""
    lines = ["| mask | S | B | density | ours fwd ms (TF/s) | flex fwd ms (TF/s) | ours fwd+bwd ms (TF/s) | "
             "flex fwd+bwd ms (TF/s) | fwd speedup | fwd+bwd speedup | build ms ours / flex | other |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        other = []
        for tag in ("cudnn", "flash", "dense"):
            if f"sdpa_{tag}_fwd_ms" in r:
                other.append(f"sdpa-{tag} {r[f'sdpa_{tag}_fwd_ms']:.2f}/{r[f'sdpa_{tag}_fb_ms']:.2f}")
        lines.append(
            f"| {LABELS.get(r['mask'], r['mask'])} | {r['S']} | {r['B']} | {r['density']:.3f} | {r['ours_fwd_ms']:.2f} "
            f"({r['ours_fwd_tflops']:.0f}) | {r['flex_fwd_ms']:.2f} ({r['flex_fwd_tflops']:.0f}) | "
            f"{r['ours_fb_ms']:.2f} ({r['ours_fb_tflops']:.0f}) | {r['flex_fb_ms']:.2f} ({r['flex_fb_tflops']:.0f}) | "
            f"{r['flex_fwd_ms'] / r['ours_fwd_ms']:.2f}x | {r['flex_fb_ms'] / r['ours_fb_ms']:.2f}x | "
            f"{r.get('ours_build_ms', float('nan')):.2f} / {r['flex_build_ms']:.2f} | {'; '.join(other)} |")
    return "\n".join(lines)


def _geomean(xs) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def v3_table(results: list[dict]) -> str:
    """Markdown table of the ``--v3`` rows: our speed over FlexAttention (same run) beside FlashMask V3's from the
    reference run, forward and forward+backward, and ours / V3 estimated as the ratio of the two; then the
    geometric means over the rows V3 has and the rows below 0.95 of V3's forward+backward ratio."""
    lines = ["| mask | S | ours fwd ms | flex fwd ms | ours/flex fwd | V3/flex fwd | ours fwd+bwd ms | flex fwd+bwd ms | "
             "ours/flex fwd+bwd | V3/flex fwd+bwd | ours/V3 fwd+bwd (est.) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ours_fw, ours_fb, v3_fw, v3_fb, below = [], [], [], [], []
    for r in results:
        fw, fb = r["flex_fwd_ms"] / r["ours_fwd_ms"], r["flex_fb_ms"] / r["ours_fb_ms"]
        v3_shape = (r["D"], r["H"], r["H_kv"]) == (128, 32, 32)  # V3's figures are for its shape only
        ref = V3_OVER_FLEX.get((r["mask"], r["S"])) if v3_shape else None
        if ref:
            ours_fw.append(fw)
            ours_fb.append(fb)
            v3_fw.append(ref[0])
            v3_fb.append(ref[1])
            if fb < 0.95 * ref[1]:
                below.append(f"{LABELS.get(r['mask'], r['mask'])} {r['S']}")
        v3_cells = (f"{ref[0]:.2f}x | " if ref else "- | ", f"{ref[1]:.2f}x | {fb / ref[1]:.2f}" if ref else "- | -")
        lines.append(f"| {LABELS.get(r['mask'], r['mask'])} | {r['S']} | {r['ours_fwd_ms']:.3f} | "
                     f"{r['flex_fwd_ms']:.3f} | {fw:.2f}x | {v3_cells[0]}{r['ours_fb_ms']:.3f} | {r['flex_fb_ms']:.3f} | "
                     f"{fb:.2f}x | {v3_cells[1]} |")
    lines.append("")
    fb_all = _geomean([r["flex_fb_ms"] / r["ours_fb_ms"] for r in results])
    fw_all = _geomean([r["flex_fwd_ms"] / r["ours_fwd_ms"] for r in results])
    lines.append(f"all rows: fwd+bwd over flex geomean {fb_all:.3f}x, fwd {fw_all:.3f}x")
    if ours_fb:
        lines.append(f"rows with a V3 figure: {len(ours_fb)}; fwd+bwd over flex geomean ours {_geomean(ours_fb):.3f}x, "
                     f"V3 {_geomean(v3_fb):.3f}x; fwd over flex geomean ours {_geomean(ours_fw):.3f}x, V3 "
                     f"{_geomean(v3_fw):.3f}x; rows below 0.95 of V3's fwd+bwd ratio: "
                     f"{', '.join(below) if below else 'none'}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default=None, help="sequence lengths (default 8192,16384,32768; --v3: 8192,16384)")
    p.add_argument("--tokens", type=int, default=32768, help="B * S")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--docs", default="lognormal", choices=("lognormal", "aligned64"),
                   help="document lengths of the document masks (doc_lengths)")
    p.add_argument("--kv-heads", type=int, default=0, help="K/V heads (GQA; default: --heads)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--masks", default=",".join(MASKS))
    p.add_argument("--dense-max-s", type=int, default=8192, help="largest S for the SDPA dense-mask baseline")
    p.add_argument("--memory-seq", type=int, default=0, help="also one causal-document pack of this length")
    p.add_argument("--out", default=None, help="append JSON lines here")
    p.add_argument("--rounds", type=int, default=0,
                   help="rounds of timing ours and flex, the order reversed every other round, each one's minimum "
                        "kept (default 1; --v3: 2, the reference's method)")
    p.add_argument("--warmup-ms", type=float, default=0, help="do_bench warm-up (default 10; --v3: 25)")
    p.add_argument("--rep-ms", type=float, default=0, help="do_bench budget per timing (default 50; --v3: 150)")
    p.add_argument("--v3", action="store_true",
                   help="FlashMask V3's same-run setting instead: B=1, its six masks at 8K and 16K (vectors on both "
                        "sides) and, at its H=32, D=128, V3's ratio to FlexAttention beside ours; --head-dim, "
                        "--heads, --kv-heads and --seqs still apply (the same masks at other shapes)")
    args = p.parse_args(argv)
    if args.v3:
        args.seqs, args.masks = args.seqs or ",".join(map(str, V3_SEQS)), ",".join(V3_MASKS)
        args.tokens, args.dense_max_s = 1, 0
    args.rounds = args.rounds or (2 if args.v3 else 1)
    args.warmup_ms = args.warmup_ms or (25 if args.v3 else 10)
    args.rep_ms = args.rep_ms or (150 if args.v3 else 50)
    args.seqs = [int(x) for x in (args.seqs or "8192,16384,32768").split(",") if x]
    args.masks = [m for m in args.masks.split(",") if m]
    if args.kv_heads and args.heads % args.kv_heads:
        p.error(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention needs a CUDA GPU")
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"triton {__import__('triton').__version__} bf16 H={args.heads} H_kv={args.kv_heads or args.heads} D={args.head_dim} docs={args.docs}", flush=True)
    mm = matmul_tflops()
    print(f"# bf16 matmul {mm:.0f} TFLOP/s", flush=True)
    res = run(args) if args.seqs and args.masks else []
    if args.memory_seq:
        row = memory_case(args, args.memory_seq)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(table(res))
    print(summary(res, mm))
    if args.v3:
        print(v3_table(res))


if __name__ == "__main__":
    main()
