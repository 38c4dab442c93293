"""Launch configuration of the Triton kernels: tile shapes, warps and pipeline stages per head dim and dtype, the
backward's product order, and the retry with fewer stages when a tile overflows shared memory.

Every number below is the fastest of an offline sweep on an H200 (``python -m flashmask.benchmarks.tune_blocks``;
results in docs/kernel_notes.md). Offline rather than ``triton.autotune``: the visit lists depend on the tile
shape, so tuning inside the launcher would build lists per candidate.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import triton
import triton.runtime.errors  # noqa: F401  (OutOfResources)

from . import launch_cache

LOG2E = 1.4426950408889634

_OVERRIDE: dict = {}  # "fwd" / "bwd" -> config dict, set by tile_override()


def pow2(d: int) -> int:
    """The padded head dim of the kernels: the next power of two >= 16 (extra columns are masked)."""
    return max(16, triton.next_power_of_2(d))


@contextlib.contextmanager
def tile_override(fwd: dict | None = None, bwd: dict | None = None):
    """Use these configs on GPU instead of the tuned ones inside the ``with`` block (the tile sweep's hook);
    ``fwd`` has :func:`fwd_config`'s keys, ``bwd`` :func:`bwd_config`'s."""
    old = dict(_OVERRIDE)
    _OVERRIDE.update({k: v for k, v in (("fwd", fwd), ("bwd", bwd)) if v is not None})
    try:
        yield
    finally:
        _OVERRIDE.clear()
        _OVERRIDE.update(old)


def fwd_config(d_pad: int, dtype: torch.dtype, on_gpu: bool, four_vectors: bool = False) -> dict:
    """Forward tile ``{BLOCK_M, BLOCK_N, num_warps, num_stages}`` for the padded head dim ``d_pad``.

    ``four_vectors``: the mask has C = 4 (LTS, LTE, UTS, UTE), whose per-stage vector loads push the 128 x 128
    3-stage pipeline past the 227 KiB of shared memory; 64 x 128 with 4 warps is the fastest tile that fits.
    Off GPU (the interpreter) 16 x 16 tiles keep the CPU tests fast.
    """
    if on_gpu and "fwd" in _OVERRIDE:
        return dict(_OVERRIDE["fwd"])
    if not on_gpu:
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    if dtype == torch.float32:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    if d_pad <= 64:  # 6 % (causal) to 27 % (documents) faster than 128 x 64
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    if d_pad <= 128:
        if four_vectors:  # global_sliding 8K / 32K: 2.18 / 2.63 ms against 2.29 / 3.10 for 128 x 64 / 8 warps
            return dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3)
        return dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)  # D = 256: 10.5 ms causal 8K (12.1 at 2 stages)


def bwd_config(d_pad: int, dtype: torch.dtype, on_gpu: bool) -> dict:
    """Backward tiles: the dK/dV kernel (``BLOCK_N`` keys per program, ``BLOCK_M`` query rows per step,
    ``num_warps``, ``num_stages``) and the dQ kernel (``DQ_BLOCK_M``, ``DQ_BLOCK_N``, ``dq_warps``, ``dq_stages``)
    for the padded head dim ``d_pad``."""
    if on_gpu and "bwd" in _OVERRIDE:
        return dict(_OVERRIDE["bwd"])
    if not on_gpu:
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1,
                    DQ_BLOCK_M=16, DQ_BLOCK_N=16, dq_warps=1, dq_stages=1)
    if dtype == torch.float32:
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1,
                    DQ_BLOCK_M=32, DQ_BLOCK_N=32, dq_warps=4, dq_stages=1)
    if d_pad <= 64:  # D = 64, GQA 4: 26-29 % faster than 64 x 128 / 8 warps
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3,
                    DQ_BLOCK_M=64, DQ_BLOCK_N=64, dq_warps=4, dq_stages=3)
    if d_pad <= 128:  # fastest of 20 tile pairs (4 stages: 2-4 % slower, 16 warps: 1.4-4x slower)
        return dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3,
                    DQ_BLOCK_M=128, DQ_BLOCK_N=64, dq_warps=8, dq_stages=3)
    # D = 256: the narrow key block relieves the two 64 x 256 fp32 accumulators (1.6-1.7x faster than 64 x 64)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2,
                DQ_BLOCK_M=128, DQ_BLOCK_N=32, dq_warps=8, dq_stages=3)


def dp_first(d_pad: int) -> bool:
    """Whether the backward kernels issue dP = dO V^T right after S = Q K^T, before the exp2 / mask math (same
    values, other instruction order), for the padded head dim ``d_pad``: 3-8 % faster at D = 64 and 7 % at
    D = 256, 3-5 % slower at D = 128 (registers are full there), on the H200."""
    return d_pad != 128


_WORKING_STAGES: dict = {}  # (id(kernel), constexprs) -> fewer num_stages than asked that fit in shared memory


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``; if the tile needs more shared memory than the GPU has, retry with fewer
    pipeline stages (same tiles, so the visit lists stay valid) and remember the count that fits. Triton's
    shared-memory use is not monotonic in ``num_stages`` (2 stages can need more than 3), so every smaller count
    is tried.

    Raises:
        triton.runtime.errors.OutOfResources: even one stage does not fit.
    """
    # keyed by the kernel's id: hashing a JITFunction runs Python code (its cache key), twice per launch here;
    # the kernels are module-level objects that live as long as the process. A call site passes its keywords in
    # one order; the keywords are copied only to change num_stages.
    key = (id(kernel), tuple(kwargs.items()))
    asked = kwargs.get("num_stages", 1)
    stages = _WORKING_STAGES.get(key, asked)
    while True:
        try:
            run = kwargs if kwargs.get("num_stages") == stages else dict(kwargs, num_stages=stages)
            launch_cache.launch(kernel, grid, *args, **run)
            if stages != asked:
                _WORKING_STAGES[key] = stages
            return
        except triton.runtime.errors.OutOfResources:
            if stages <= 1:
                raise
            warnings.warn(f"{kernel.fn.__name__}: out of shared memory with num_stages={stages}, retrying with "
                          f"num_stages={stages - 1}", RuntimeWarning, stacklevel=3)
            stages -= 1
