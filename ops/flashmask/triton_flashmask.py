"""Triton FlashMask attention: custom ops ``flashmask::triton_fwd`` / ``triton_bwd`` (with autograd), launchers.

Shape legend: B batch, S_q / S_k query / key length, H_q / H_k query / kv heads, H_mask mask heads (1 or H_k),
D head dim (any size; padded to the next power of two >= 16 inside the kernels with masking).

Kernels: ``triton_fwd`` (forward), ``triton_bwd`` (dK/dV column-parallel + dQ), ``gluon_bwd`` (the backward on
sm_90 at D = 128: warp-specialised, five products per tile; :func:`gluon_bwd_eligible`), ``triton_blocklists``
(per-key-block min/max and visit lists; torch reference in ``triton_prep``). Algorithm: FlashMask (Wang et al.,
ICLR 2025, arXiv 2410.01359) on a FlashAttention-2 schedule; see docs/kernel_notes.md.

Runs on CUDA, or on CPU under ``TRITON_INTERPRET=1`` (fp32/fp16 only; used by the CPU tests).
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import triton
import triton.runtime.errors  # noqa: F401  (OutOfResources)

from .triton_bwd import _flashmask_bwd_dkdv_kernel, _flashmask_bwd_dq_kernel, _flashmask_bwd_preprocess_kernel
from .triton_fwd import _flashmask_fwd_kernel
from .triton_prep import MaskVectors, _env_choice

LOG2E = 1.4426950408889634


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _pow2(x: int) -> int:
    return max(16, triton.next_power_of_2(x))


def _env_cfg(name: str, keys: tuple[str, ...]) -> dict | None:
    """Override from an environment variable of comma-separated ints (used by benchmarks/tune_blocks.py)."""
    raw = os.environ.get(name)
    if not raw:
        return None
    vals = [int(x) for x in raw.split(",")]
    if len(vals) != len(keys):
        raise ValueError(f"{name}={raw!r}: expected {len(keys)} comma-separated ints {keys}")
    return dict(zip(keys, vals))


def fwd_config(d_pad: int, dtype: torch.dtype, on_gpu: bool, four_vectors: bool = False) -> dict:
    """Forward tile shape ``{BLOCK_M, BLOCK_N, num_warps, num_stages}`` for padded head dim ``d_pad``.

    ``four_vectors``: the mask has C=4 (LTS, LTE, UTS, UTE), whose per-stage vector loads push the 128 x 128
    3-stage pipeline over the 227 KiB of shared memory; 64 x 128 with 4 warps is the fastest fit (v5 sweep).
    ``FLASHMASK_FWD_CFG="BM,BN,warps,stages"`` overrides it on GPU (offline tuning, ``benchmarks/tune_blocks.py``;
    the numbers are in docs/kernel_notes.md).
    """
    env = _env_cfg("FLASHMASK_FWD_CFG", ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")) if on_gpu else None
    if env:
        return env
    if not on_gpu:
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    if dtype == torch.float32:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    if d_pad <= 64:  # H200 sweep v3: 64x64/4 warps/3 stages beats 128x64 by 6 % (causal) to 27 % (documents)
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    if d_pad <= 128:  # H200 sweep v3: 128x128/8 warps/3 stages fastest on full and causal
        if four_vectors:  # H200 sweep v5, global_sliding: 2.18 / 2.63 ms at 8K / 32K vs 2.29 / 3.10 for 128x64/8
            return dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3)
        return dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
    # D=256, H200 sweep v3: 64x64/4 warps/3 stages 10.5 ms causal 8K vs 12.1 at 2 stages
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)


def dp_first(d_pad: int) -> bool:
    """Whether the backward kernels issue dP = dO V^T right after S = Q K^T, before the exp2/mask math, rather
    than after it (same values), for the padded head dim ``d_pad`` (so D = 96 follows D = 128). H200 A/B, v6
    (docs/kernel_notes.md): 3-8 % faster backward at D = 64 and 7 % at D = 256, 3-5 % slower at D = 128.
    ``FLASHMASK_DP_FIRST=0|1`` overrides it (benchmarking)."""
    env = _env_choice("FLASHMASK_DP_FIRST", "auto", ("auto", "0", "1"))
    return d_pad != 128 if env == "auto" else env == "1"


def lpt_enabled() -> bool:
    """``FLASHMASK_LPT=1``: launch every kernel with heads fastest and its outer blocks by decreasing listed work
    (``MaskVectors.lpt_order``), so the heaviest blocks of all heads start first and light ones fill the tail.
    Default ``0``: outer blocks in a fixed order (last query blocks first; key blocks in order), heads slowest.
    Written for uneven masks at small batch (session 6); H200 A/B in session 7: 5-10 % slower at D = 128, mixed at
    D = 64, so off (docs/kernel_notes.md)."""
    return _env_choice("FLASHMASK_LPT", "0", ("0", "1")) == "1"


def _grid(rows: int, heads: int, lpt: bool) -> tuple[int, int]:
    return (heads, rows) if lpt else (rows, heads)


def gqa_split(group: int, kv_elements: int = 0) -> int:
    """Programs per KV head in the dK/dV kernel: 1 (default) = one program loops all ``group`` query heads of its
    KV head; k > 1 (``FLASHMASK_GQA_SPLIT=k``, k dividing ``group``; ``full`` = ``group``) shares them out over k
    programs whose fp32 partial dK / dV the launcher sums. Written for the training shape (32 query / 8 KV heads,
    B = 1: 1024 programs of 4 heads each; docs/kernel_notes.md, session 6); off by default: no gain in the H200 A/B
    of session 7. ``kv_elements`` (B * S_k * H_k * D of this call): a split whose fp32 partial buffer (k times
    that) would pass the kernels' int32 offsets (2**31) falls back to none, as q / k / v themselves are checked.

    Raises:
        ValueError: a value that is not ``full`` or a positive integer.
    """
    raw = os.environ.get("FLASHMASK_GQA_SPLIT", "1").strip()
    if raw == "full":
        raw = str(group)
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"FLASHMASK_GQA_SPLIT={raw!r}: expected a positive integer or 'full'")
    k = int(raw)
    if group % k or kv_elements * k > 2**31:  # does not divide this call's group / buffer past int32 offsets
        return 1
    return k


def bwd_config(d_pad: int, dtype: torch.dtype, on_gpu: bool) -> dict:
    """Backward tile shapes: dK/dV kernel (BLOCK_N keys per program, BLOCK_M query rows per step) and dQ kernel.

    ``FLASHMASK_BWD_CFG="BM,BN,warps,stages,dqBM,dqBN,dqwarps,dqstages"`` overrides it on GPU.
    """
    env = _env_cfg("FLASHMASK_BWD_CFG", ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "DQ_BLOCK_M",
                                         "DQ_BLOCK_N", "dq_warps", "dq_stages")) if on_gpu else None
    if env:
        return env
    if not on_gpu:
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1,
                    DQ_BLOCK_M=16, DQ_BLOCK_N=16, dq_warps=1, dq_stages=1)
    if dtype == torch.float32:
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1,
                    DQ_BLOCK_M=32, DQ_BLOCK_N=32, dq_warps=4, dq_stages=1)
    if d_pad <= 64:  # H200 sweep v3 (D=64, GQA 4): 64x64/4 warps/3 stages, 26-29 % faster than 64x128/8
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3,
                    DQ_BLOCK_M=64, DQ_BLOCK_N=64, dq_warps=4, dq_stages=3)
    if d_pad <= 128:  # H200 sweep v3: 64 query rows x 128 keys, 8 warps, 3 stages
        return dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3,
                    DQ_BLOCK_M=128, DQ_BLOCK_N=64, dq_warps=8, dq_stages=3)
    # D=256, H200 sweep v5: 32 keys x 64 query rows / 4 warps, dQ 128 x 32 / 8 warps: 54.4 ms causal 8K, 21.8
    # causal document, vs 86.2 / 36.7 for the v3 64x64/8 warps/2 stages in both kernels
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2,
                DQ_BLOCK_M=128, DQ_BLOCK_N=32, dq_warps=8, dq_stages=3)


_WORKING_STAGES: dict = {}  # (kernel, constexprs) -> num_stages that fit in shared memory


def _launch(kernel, grid, *args, **kwargs):
    """Launch; if the tile config needs more shared memory than the GPU has, retry with fewer pipeline stages
    (same tiles, so the block lists stay valid) and remember the count that fits. Triton's shared-memory use is
    not monotonic in ``num_stages`` (a 2-stage pipeline can need more than a 3-stage one), so every smaller
    count is tried."""
    key = (kernel.fn.__name__, tuple(sorted(kwargs.items())))
    stages = _WORKING_STAGES.get(key, kwargs.get("num_stages", 1))
    while True:
        try:
            kernel[grid](*args, **dict(kwargs, num_stages=stages))
            _WORKING_STAGES[key] = stages
            return
        except triton.runtime.errors.OutOfResources:
            if stages <= 1:
                raise
            warnings.warn(f"{kernel.fn.__name__}: out of shared memory with num_stages={stages}, retrying with "
                          f"num_stages={stages - 1}", RuntimeWarning, stacklevel=3)
            stages -= 1


def _lists(mv: MaskVectors, block_m: int, block_n: int, by_key: bool):
    """``mv.block_lists``; ``FLASHMASK_RANGE_LOOPS=0`` hides the contiguous runs (every unmasked block then goes
    through the indirect list), a switch for benchmarking the two loop forms against each other."""
    idx, n_part, n_full, full_lo = mv.block_lists(block_m, block_n, by_key)
    if _env_choice("FLASHMASK_RANGE_LOOPS", "1", ("0", "1")) == "0":
        full_lo = torch.full_like(full_lo, -1)
    return idx, n_part, n_full, full_lo


def _flags(mv: MaskVectors, causal: bool, dtype: torch.dtype) -> dict:
    return dict(CAUSAL=causal, HAS_MASK=mv.has_mask, HAS_LTE=mv.has_lte, HAS_UT=mv.has_ut, HAS_UTS=mv.has_uts,
                DOT_PREC="ieee" if dtype == torch.float32 else "tf32")


def _even(s_rows: int, s_cols: int, block_rows: int, block_cols: int, d: int, d_pad: int) -> bool:
    """True when no tile crosses a sequence end and D needs no padding: the kernels then load and store
    without bounds predicates (FlexAttention's ``IS_DIVISIBLE``)."""
    return s_rows % block_rows == 0 and s_cols % block_cols == 0 and d == d_pad


def _tma_enabled(t: torch.Tensor, use: str) -> bool:
    """TMA on a Hopper-or-newer GPU (or the CPU interpreter, for the tests) for ``use``: "fwd" / "bwd" (tensor
    descriptor loads of that pass) or "dq_reduce" (``FLASHMASK_ATOMIC_DQ=tma``, asked for explicitly).
    ``FLASHMASK_TMA``: unset or ``fwd`` = forward loads only (H200 A/B: forward 7-9 % faster at D=128, backward
    loads -3 % to +27 %; docs/kernel_notes.md v4), ``1`` = everywhere, ``0`` = nowhere."""
    mode = _env_choice("FLASHMASK_TMA", "fwd", ("fwd", "1", "0"))
    if mode == "0" or (mode == "fwd" and use == "bwd"):
        return False
    return _interpreting() or (t.is_cuda and torch.cuda.get_device_capability(t.device)[0] >= 9)


def _tma_2d(t: torch.Tensor, block_rows: int):
    """A 2-D tensor descriptor over ``t`` ``[B, S, H, D]`` seen as ``[B*S, H*D]`` with ``[block_rows, D]`` boxes,
    or None when the layout does not allow it (rows of one stride, heads adjacent, 16-byte aligned). Only used
    when the launch is EVEN, so a box never crosses into the next batch or head."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    b, s, h, d = t.shape
    row = t.stride(1)
    if t.stride(3) != 1 or t.stride(2) != d or (b > 1 and t.stride(0) != s * row):
        return None
    if (row * t.element_size()) % 16 or t.data_ptr() % 16 or (d * t.element_size()) % 16:
        return None
    return TensorDescriptor(t, [b * s, h * d], [row, 1], [block_rows, d])


def _operands(kernel: str, even: bool, *tensor_rows):
    """``(operands, tma)``: TMA descriptors for every ``(tensor, box_rows)`` when the launch is EVEN, TMA is
    enabled for ``kernel`` and every layout allows it; else the tensors themselves (pointer loads)."""
    if even and _tma_enabled(tensor_rows[0][0], kernel):
        descs = [_tma_2d(t, rows) for t, rows in tensor_rows]
        if all(x is not None for x in descs):
            return descs, True
    return [t for t, _ in tensor_rows], False


def _fwd(q, k, v, mv: MaskVectors, causal: bool, scale: float):
    if gluon_fwd_eligible(q, k, v):
        out = _gluon_fwd(q, k, v, mv, causal, scale)
        if out is not None:
            return out
    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    d_pad = _pow2(d)
    cfg = fwd_config(d_pad, q.dtype, q.is_cuda and not _interpreting(), mv.has_uts)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    idx, n_part, n_full, full_lo = _lists(mv, bm, bn, by_key=False)
    o = torch.empty_like(q)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    lpt = lpt_enabled()
    order = mv.lpt_order(bm, bn, by_key=False) if lpt else n_part  # n_part: an unused placeholder pointer
    grid = _grid(idx.shape[1], b * h_q, lpt)
    even = _even(s_q, s_k, bm, bn, d, d_pad)
    (q_, k_, v_), tma = _operands("fwd", even, (q, bm), (k, bn), (v, bn))
    _launch(_flashmask_fwd_kernel, grid,
        q_, k_, v_, o, lse, mv.lts, mv.lte, mv.uts, mv.ute, idx, n_part, n_full, full_lo,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        s_q, s_k, h_q, mv.h_mask, h_q // h_k, idx.shape[1], idx.shape[2], scale * LOG2E, order,
        D=d, BLOCK_D=d_pad, BLOCK_M=bm, BLOCK_N=bn, EVEN=even, TMA=tma, LPT=lpt,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_flags(mv, causal, q.dtype),
    )
    return o, lse


_GLUON_FAILED: list = []  # "Type: message" of the Gluon backward's first failure in this process (then Triton only)
_GLUON_FWD_FAILED: list = []  # the same for the Gluon forward


def _hopper_gluon_shape(ts, q, s_q_multiple: int) -> bool:
    """The common scope of the Gluon kernels: CUDA sm_90 (H100 / H200), bf16 / fp16, D = 128, ``S_q`` a multiple
    of ``s_q_multiple``, ``S_k % 128 == 0``, every tensor of ``ts`` contiguous, 16-byte aligned and of q's dtype,
    and a Triton with Gluon's Hopper API."""
    if _interpreting() or not q.is_cuda or torch.version.hip is not None:
        return False
    b, s_q, h_q, d = q.shape
    if (d != 128 or q.dtype not in (torch.bfloat16, torch.float16) or s_q % s_q_multiple or ts[1].shape[1] % 128
            or torch.cuda.get_device_capability(q.device) != (9, 0)):
        return False
    if any(t.dtype != q.dtype or not t.is_contiguous() or t.data_ptr() % 16 for t in ts):
        return False
    try:
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401
    except ImportError:
        return False
    return True


def gluon_fwd_eligible(q, k, v) -> bool:
    """Whether the forward runs the Gluon kernel (``gluon_fwd``: two consumer warpgroups that each overlap one
    key block's softmax with the previous block's P V product, and a TMA loader).

    Yes when ``FLASHMASK_FWD`` is ``auto`` (default; falls back to the Triton kernel if the Gluon one fails) or
    ``gluon`` (a failure raises), on an NVIDIA sm_90 GPU, with q, k, v contiguous, 16-byte aligned bf16 / fp16,
    D = 128, ``S_q % 128 == 0`` and ``S_k % 128 == 0``, a Triton with Gluon, and no earlier failure in this
    process. It measured 1.01-1.19x the Triton forward (docs/kernel_notes.md, session 13).
    ``FLASHMASK_FWD=triton`` keeps the Triton kernel (the reference path, and the only one that
    ``FLASHMASK_FWD_CFG`` / ``LPT`` / ``TMA`` act on). Both are reproducible run to run (no atomics), so
    ``deterministic`` does not matter."""
    mode = _env_choice("FLASHMASK_FWD", "auto", ("auto", "gluon", "triton"))
    if mode == "triton" or _GLUON_FWD_FAILED:
        return False
    return _hopper_gluon_shape((q, k, v), q, 128)


def _gluon_fwd(q, k, v, mv: MaskVectors, causal: bool, scale: float):
    """The Gluon forward, or None when it failed and the Triton kernel should run instead (:func:`_run_gluon`)."""

    def launch():
        from . import gluon_fwd  # inside: a Triton whose Gluon lacks what it imports falls back like a failed launch

        return gluon_fwd.launch(q, k, v, _lists(mv, gluon_fwd.BLOCK_M.value, gluon_fwd.BLOCK_N.value, by_key=False),
                                mv, causal, scale, LOG2E)

    return _run_gluon("forward", "FLASHMASK_FWD", _GLUON_FWD_FAILED, q.device, launch)


def gluon_bwd_eligible(q, k, v, do, deterministic: bool) -> bool:
    """Whether the backward runs the Gluon kernel (``gluon_bwd``: five products per tile, warp-specialised).

    Yes when ``FLASHMASK_BWD`` is ``auto`` (default) or ``gluon``; the call does not ask for reproducibility
    (``deterministic`` False and ``torch.are_deterministic_algorithms_enabled()`` False: its dQ is summed with
    atomics); the GPU is an NVIDIA sm_90 (H100 / H200); q, k, v, dO are contiguous, 16-byte aligned bf16 / fp16
    with D = 128, ``S_q % 64 == 0`` and ``S_k % 128 == 0``; Triton has Gluon; and it has not failed before in this
    process. ``FLASHMASK_BWD=triton`` keeps the Triton kernels (the reference path; bitwise reproducible dQ; the
    only one that the backward tuning switches ``FLASHMASK_BWD_CFG`` / ``ATOMIC_DQ`` / ``DP_FIRST`` / ``LPT`` /
    ``GQA_SPLIT`` / ``TMA`` act on)."""
    mode = _env_choice("FLASHMASK_BWD", "auto", ("auto", "gluon", "triton"))
    if mode == "triton" or deterministic or torch.are_deterministic_algorithms_enabled() or _GLUON_FAILED:
        return False
    return _hopper_gluon_shape((q, k, v, do), q, 64)


def _gluon_bwd(do, q, k, v, lse2, delta, mv: MaskVectors, causal: bool, scale: float):
    """The Gluon backward, or None when it failed and the Triton kernels should run instead (:func:`_run_gluon`)."""

    def launch():
        from . import gluon_bwd

        lists = _lists(mv, gluon_bwd.BLOCK_M.value, gluon_bwd.BLOCK_N.value, by_key=True)
        return gluon_bwd.launch(do, q, k, v, lse2, delta, lists, mv, causal, scale, LOG2E)

    return _run_gluon("backward", "FLASHMASK_BWD", _GLUON_FAILED, q.device, launch)


def _run_gluon(which: str, env: str, failed: list, device, launch):
    """``launch()``, or None when it failed and the Triton ``which`` (forward / backward) should run instead.

    ``env`` = ``gluon`` re-raises, and so does a failure while a CUDA graph is captured (the capture may be
    invalid already). Out of memory falls back for this call only; any other failure (a Triton whose Gluon API
    differs, a compile error) is appended to ``failed`` (a string: no frames, so no tensors, kept alive), warns
    once and switches this process to the Triton kernel."""
    try:
        return launch()
    except Exception as e:
        if _env_choice(env, "auto", ("auto", "gluon", "triton")) == "gluon" or _capturing(device):
            raise
        if isinstance(e, torch.OutOfMemoryError):
            return None
        failed.append(f"{type(e).__name__}: {str(e)[:300]}")
    warnings.warn(f"flashmask: the Gluon {which} failed ({failed[-1]}); using the Triton {which} from now on "
                  f"({env}=triton silences this)", RuntimeWarning, stacklevel=4)
    return None


def _preprocess(o, do, lse, dlse):
    """Delta = rowsum(dO * O) - dLSE and LSE in log2 units, fp32 ``[B, H_q, S_q]``, in one pass over O and dO."""
    b, s_q, h_q, d = o.shape
    delta = torch.empty_like(lse)
    lse2 = torch.empty_like(lse)
    dlse_c = dlse.float().contiguous() if dlse is not None else lse
    pre_bm = 64
    _launch(_flashmask_bwd_preprocess_kernel, (triton.cdiv(s_q, pre_bm), b * h_q),
        o, do, lse.contiguous(), dlse_c, delta, lse2, o.stride(0), o.stride(1), o.stride(2),
        do.stride(0), do.stride(1), do.stride(2), s_q, h_q, LOG2E,
        D=d, BLOCK_D=_pow2(d), BLOCK_M=pre_bm, HAS_DLSE=dlse is not None, num_warps=4, num_stages=1,
    )
    return delta, lse2


def _bwd(do, q, k, v, o, lse, dlse, mv: MaskVectors, causal: bool, scale: float, deterministic: bool):
    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    d_pad = _pow2(d)
    delta, lse2 = _preprocess(o, do, lse, dlse)
    if gluon_bwd_eligible(q, k, v, do, deterministic):
        grads = _gluon_bwd(do, q, k, v, lse2, delta, mv, causal, scale)
        if grads is not None:
            return grads
    cfg = bwd_config(d_pad, q.dtype, q.is_cuda and not _interpreting())
    lpt = lpt_enabled()
    flags = dict(_flags(mv, causal, q.dtype), DP_FIRST=dp_first(d_pad), LPT=lpt)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    split = gqa_split(h_q // h_k, b * s_k * h_k * d)
    if split > 1:  # fp32 partial sums, head slot hk * split + part, summed after the kernel
        dk_acc = torch.empty(b, s_k, h_k * split, d, dtype=torch.float32, device=k.device)
        dv_acc = torch.empty_like(dk_acc)
    else:
        dk_acc, dv_acc = dk, dv
    # dQ: by default a separate row-parallel kernel (bitwise reproducible, and on the H200 sweep v3 as fast as or
    # faster than thread atomics: 27.6 vs 28.8 ms full 8K D=128, 0.88 vs 1.21 ms causal document D=64).
    # FLASHMASK_ATOMIC_DQ=1 adds dQ tiles from the dK/dV kernel with fp32 thread atomics (FlashMask v1's scheme),
    # =tma with TMA bulk reduce-adds (FlashAttention-3's scheme; EVEN launches on Hopper, else thread atomics);
    # both only when deterministic=False.
    dq_mode = _env_choice("FLASHMASK_ATOMIC_DQ", "0", ("0", "1", "tma"))
    atomic = not deterministic and dq_mode in ("1", "tma")
    bn, bm = cfg["BLOCK_N"], cfg["BLOCK_M"]
    even = _even(s_q, s_k, bm, bn, d, d_pad)
    dqa = dqa_arg = lse  # placeholders when dQ has its own kernel
    sdq, tma_dq = (0, 0, 0), False
    # (the CPU interpreter has no descriptor reduce: thread atomics there)
    if atomic and dq_mode == "tma" and even and not _interpreting() and _tma_enabled(q, "dq_reduce"):
        dqa = torch.zeros(b, s_q, h_q, d, dtype=torch.float32, device=q.device)  # q's layout, unscaled
        dqa_arg = _tma_2d(dqa, bm)
        tma_dq = dqa_arg is not None
    if atomic and not tma_dq:  # unscaled fp32 dQ accumulator [B, H_q, S_q, D] for thread atomics
        dqa = dqa_arg = torch.zeros(b, h_q, s_q, d, dtype=torch.float32, device=q.device)
        sdq = (dqa.stride(0), dqa.stride(2), dqa.stride(1))  # (batch, seq, head) like q's
    idx, n_part, n_full, full_lo = _lists(mv, bm, bn, by_key=True)  # idx [L, NUM_N, NUM_M]
    (q_, do_), tma = _operands("bwd", even, (q, bm), (do, bm))  # dK/dV streams Q and dO tiles
    order = mv.lpt_order(bm, bn, by_key=True) if lpt else n_part  # n_part: an unused placeholder pointer
    _launch(_flashmask_bwd_dkdv_kernel, _grid(idx.shape[1], b * h_k * split, lpt),
        q_, k, v, do_, lse2, delta, dk_acc, dv_acc, dqa_arg, mv.lts, mv.lte, mv.uts, mv.ute, idx, n_part, n_full,
        full_lo,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dk_acc.stride(0), dk_acc.stride(1), dk_acc.stride(2), dv_acc.stride(0), dv_acc.stride(1), dv_acc.stride(2),
        sdq[0], sdq[1], sdq[2],
        s_q, s_k, h_q, h_k, mv.h_mask, h_q // h_k, split, idx.shape[1], idx.shape[2], scale * LOG2E, scale, order,
        D=d, BLOCK_D=d_pad, BLOCK_M=bm, BLOCK_N=bn, ATOMIC_DQ=atomic, EVEN=even, TMA=tma, TMA_DQ=tma_dq,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **flags,
    )
    if split > 1:
        dk.copy_(dk_acc.view(b, s_k, h_k, split, d).sum(3))
        dv.copy_(dv_acc.view(b, s_k, h_k, split, d).sum(3))
    if atomic:
        dq = torch.empty_like(q)
        torch.mul(dqa if tma_dq else dqa.transpose(1, 2), scale, out=dq)  # [B, S_q, H_q, D], scaled once
        return dq, dk, dv
    dq = torch.empty_like(q)
    bm2, bn2 = cfg["DQ_BLOCK_M"], cfg["DQ_BLOCK_N"]
    idx2, n_part2, n_full2, full_lo2 = _lists(mv, bm2, bn2, by_key=False)
    even = _even(s_q, s_k, bm2, bn2, d, d_pad)
    (k_, v_), tma = _operands("bwd", even, (k, bn2), (v, bn2))  # dQ streams K and V tiles
    order2 = mv.lpt_order(bm2, bn2, by_key=False) if lpt else n_part2
    _launch(_flashmask_bwd_dq_kernel, _grid(idx2.shape[1], b * h_q, lpt),
        q, k_, v_, do, lse2, delta, dq, mv.lts, mv.lte, mv.uts, mv.ute, idx2, n_part2, n_full2,
        full_lo2,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        s_q, s_k, h_q, mv.h_mask, h_q // h_k, idx2.shape[1], idx2.shape[2], scale * LOG2E, scale, order2,
        D=d, BLOCK_D=d_pad, BLOCK_M=bm2, BLOCK_N=bn2, EVEN=even, TMA=tma,
        num_warps=cfg["dq_warps"], num_stages=cfg["dq_stages"], **flags,
    )
    return dq, dk, dv


def _check_int32_offsets(**tensors) -> None:
    """ValueError when an element offset of a tensor exceeds 2**31 - 1: the kernels compute addresses as program
    ids times int32 strides (``b * stride(0)``), which would wrap around and read / write out of bounds."""
    for name, t in tensors.items():
        span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
        if span > 2**31:  # span - 1 is the largest offset
            raise ValueError(f"flashmask_attention_triton: {name} {tuple(t.shape)} spans {span} elements, over the "
                             "int32 indexing limit of 2**31 of the Triton kernels; split the batch (or the heads) "
                             "into smaller calls")


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


_NO_MASK: dict = {}  # (causal, S_q, S_k, device) -> MaskVectors without index tensor


def _capturing(device) -> bool:
    """True while a CUDA graph is being captured, or while torch.compile's CUDA-graph trees
    (``mode="reduce-overhead"``) warm one up or record it: the warm-up allocates from the graph's private pool, and
    a tensor kept alive past the call there is an error ("tensors in the cudagraph pool not tracked as outputs")."""
    device = torch.device(device)
    if device.type != "cuda":
        return False
    if torch.cuda.is_current_stream_capturing():
        return True
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return False
    try:  # private API (torch 2.11 - 2.13): absent or changed means no graph trees to step around
        manager = trees.get_manager(device.index if device.index is not None else torch.cuda.current_device(),
                                    create_if_none_exists=False)
        return manager is not None and (manager.in_warmup or manager.in_recording)
    except Exception:
        return False


def _mask_vectors(sri, causal: bool, seq_q: int, seq_k: int, device) -> MaskVectors:
    """Preprocessed mask (SoA vectors, block min/max, visit lists), cached on the index tensor itself.

    All layers of a forward pass receive the same ``startend_row_indices`` tensor, so the O(N + Tr*Tc)
    preprocessing runs once per batch, not once per layer and pass. The key includes ``sri._version`` so an
    in-place edit of the indices rebuilds it. Without an index tensor the visit lists depend only on the mode and
    the lengths: they are kept in a small module-level cache (before, every call rebuilt them: about 15 small
    launches per pass). Inference tensors (``torch.inference_mode``) have no version counter: rebuilt every call.

    While a CUDA graph is being captured (``torch.compile(mode="reduce-overhead")``, ``torch.cuda.graph``) nothing is
    read from or written to either cache: a replay runs no Python, so lists taken from a cache would be the capture
    call's lists on every replay, whatever mask the static input holds then (and ``_NO_MASK`` may free them). Built
    inside the capture, the preprocessing kernels are part of the graph and rerun on each replay from its input.
    """
    if _capturing(device):
        return MaskVectors(sri, causal, seq_q, seq_k, device)
    if sri is None:
        key = (causal, seq_q, seq_k, torch.device(device))
        mv = _NO_MASK.get(key)
        if mv is None:
            if len(_NO_MASK) >= 32:  # many distinct lengths (e.g. generation): keep the cache bounded
                _NO_MASK.clear()
            mv = _NO_MASK[key] = MaskVectors(None, causal, seq_q, seq_k, device)
        return mv
    if sri.is_inference():
        return MaskVectors(sri, causal, seq_q, seq_k, device)
    key = (causal, seq_q, seq_k, sri._version)
    cached = getattr(sri, "_flashmask_vectors", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    mv = MaskVectors(sri, causal, seq_q, seq_k, device)
    sri._flashmask_vectors = (key, mv)
    return mv


# The attention is one PyTorch custom op per pass, so ``torch.compile`` sees an opaque call (one graph around it)
# instead of tracing into the launchers (an H200 run compiling each decoder layer around the old
# autograd.Function broke the graph 9 times inside it and ran 0.94x eager: docs/benchmarks.md, Run v6).
# The namespace is the package's import name ("flashmask"): a copy of the package imported under another name (the
# benchmarks' --alt A/B copies) gets ops of its own, because torch.library.custom_op silently replaces the kernels
# of a name that already exists (both copies then ran the last-imported code).
_NS = (__package__ or "flashmask").replace(".", "_")


def _attention_fwd(q, k, v, sri, causal: bool, scale: float, deterministic: bool = False):
    """Mask vectors (cached per index tensor), then the forward kernel: the body of both autograd paths."""
    return _fwd(q, k, v, _mask_vectors(sri, causal, q.shape[1], k.shape[1], q.device), causal, scale)


def _attention_bwd(do, q, k, v, o, lse, dlse, sri, causal: bool, scale: float, deterministic: bool):
    """Mask vectors (cached per index tensor), then the backward kernels: the body of both autograd paths."""
    mv = _mask_vectors(sri, causal, q.shape[1], k.shape[1], q.device)
    return _bwd(do, q, k, v, o, lse, dlse, mv, causal, scale, deterministic)


@torch.library.custom_op(f"{_NS}::triton_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sri: torch.Tensor | None, causal: bool,
            scale: float, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B,S_q,H_q,D], lse fp32 [B,H_q,S_q])``; ``deterministic`` is only read by the backward."""
    return _attention_fwd(q, k, v, sri, causal, scale, deterministic)


@_fwd_op.register_fake
def _(q, k, v, sri, causal, scale, deterministic):
    b, s_q, h_q, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h_q, s_q), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::triton_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
            lse: torch.Tensor, dlse: torch.Tensor | None, sri: torch.Tensor | None, causal: bool, scale: float,
            deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` shaped like ``q, k, v``."""
    return _attention_bwd(do, q, k, v, o, lse, dlse, sri, causal, scale, deterministic)


@_bwd_op.register_fake
def _(do, q, k, v, o, lse, dlse, sri, causal, scale, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, sri, causal, scale, deterministic = inputs
    ctx.save_for_backward(q, k, v, *output, *([] if sri is None else [sri]))
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic


def _backward_with(bwd, ctx, do, dlse):
    """The autograd backward of both paths: ``bwd`` is ``_bwd_op`` (custom op) or ``_attention_bwd`` (eager)."""
    q, k, v, o, lse, *sri = ctx.saved_tensors
    do = torch.zeros_like(o) if do is None else _last_dim_contiguous(do)
    dq, dk, dv = bwd(do, q, k, v, o, lse, dlse, sri[0] if sri else None, ctx.causal, ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None, None


def _backward(ctx, do, dlse):
    return _backward_with(_bwd_op, ctx, do, dlse)


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerFunction(torch.autograd.Function):
    """The same two passes as ``_fwd_op`` / ``_bwd_op`` for eager calls, without the ``torch.library`` layers
    (dispatch, alias checks, autograd wrapper). On the H200 at the 1B training shape (B = 1, 8K, 32 / 8 heads,
    D = 64) the custom ops cost about 200 us of host time per forward+backward on top of 0.75 ms of kernels, so
    small calls were host-bound (docs/kernel_notes.md, session 7). ``torch.compile`` still sees the custom op
    (:func:`flashmask_attention_triton` picks the path). Gradients are not materialised: an unused LSE output
    gives ``dlse = None`` (no zeros tensor, no ``HAS_DLSE`` loads)."""

    @staticmethod
    def forward(ctx, *inputs):  # q, k, v, sri, causal, scale, deterministic (as _fwd_op)
        ctx.set_materialize_grads(False)
        output = _attention_fwd(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable  # as _bwd_op (no autograd formula): a double backward raises
    def backward(ctx, do, dlse):
        return _backward_with(_attention_bwd, ctx, do, dlse)


def _use_custom_op(*tensors) -> bool:
    """The custom op under ``torch.compile`` / export, for tensor subclasses (fake, functional, DTensor) and meta
    tensors (its fake kernel gives the shapes), or with ``FLASHMASK_EAGER_OP=1``; the plain autograd.Function for
    eager calls on ordinary tensors."""
    if torch.compiler.is_compiling() or any(type(t) is not torch.Tensor or t.is_meta for t in tensors
                                            if t is not None):
        return True
    return _env_choice("FLASHMASK_EAGER_OP", "0", ("0", "1")) == "1"


def flashmask_attention_triton(q, k, v, startend_row_indices, causal: bool, softmax_scale: float,
                               deterministic: bool = False):
    """FlashMask attention on the Triton kernels; returns ``(out [B,S_q,H_q,D], lse fp32 [B,H_q,S_q])``.

    Args:
        q: ``[B, S_q, H_q, D]``; k, v: ``[B, S_k, H_k, D]``; fp16/bf16 (fp32 also works; on GPU its dots
            run in IEEE fp32). Inputs are assumed validated by :func:`flashmask.flashmask_attention`.
        startend_row_indices: int32 ``[B, H_mask, S_k, C]`` or None (semantics in :mod:`flashmask.dense`).
        causal: FlashMask causal mode (requires S_q == S_k, checked by the API).
        softmax_scale: score multiplier.
        deterministic: guarantee a bitwise reproducible backward (also implied by
            ``torch.use_deterministic_algorithms(True)``): the Triton kernels, which compute dQ in a separate
            row-parallel kernel (no atomics). With ``deterministic=False`` on an sm_90 GPU at D = 128 the Gluon
            backward runs instead (``gluon_bwd``; dQ summed by fp32 TMA reduce-adds, not bitwise reproducible; see
            :func:`gluon_bwd_eligible`); elsewhere the Triton kernels, where ``FLASHMASK_ATOMIC_DQ=1`` switches dQ to
            fp32 thread atomics and ``=tma`` to TMA bulk reduce-adds (Hopper, EVEN launches; thread atomics
            otherwise, including the CPU interpreter).

    Raises:
        RuntimeError: tensors on CPU without ``TRITON_INTERPRET=1`` (set before triton is imported).
        ValueError: bf16 tensors on CPU (the interpreter computes bf16 dots wrongly: numpy has no bf16); an
            unknown value of ``FLASHMASK_TMA`` / ``FLASHMASK_ATOMIC_DQ`` / ``FLASHMASK_RANGE_LOOPS`` /
            ``FLASHMASK_DP_FIRST`` / ``FLASHMASK_PREP`` / ``FLASHMASK_LPT`` / ``FLASHMASK_GQA_SPLIT`` /
            ``FLASHMASK_EAGER_OP``; q, k or v
            spanning more than 2**31 elements (or a visit list that long: ``triton_blocklists.block_lists``), past
            the kernels' int32 indexing.
    """
    if not q.is_cuda and not _interpreting():
        raise RuntimeError(
            "flashmask_attention_triton needs CUDA tensors, or TRITON_INTERPRET=1 set before importing triton "
            "(CPU interpreter, slow; fp32/fp16 only). Use impl='reference' on CPU.")
    if not q.is_cuda and q.dtype == torch.bfloat16:
        raise ValueError("flashmask_attention_triton on CPU (TRITON_INTERPRET=1) supports float32/float16 only: "
                         "the interpreter gives wrong bf16 results. Cast to float32 or use impl='reference'.")
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    _check_int32_offsets(q=q, k=k, v=v)
    if _use_custom_op(q, k, v, startend_row_indices):
        return _fwd_op(q, k, v, startend_row_indices, causal, float(softmax_scale), deterministic)
    return _EagerFunction.apply(q, k, v, startend_row_indices, causal, float(softmax_scale), deterministic)
