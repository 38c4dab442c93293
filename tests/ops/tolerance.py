"""Shared numeric assertion for kernel tests: tolerance derived from a same-dtype PyTorch run.

Rule (one tensor): with ``ref`` the high-precision reference (fp32 or fp64) and ``torch_same`` the plain
PyTorch computation in the kernel's dtype,

    pass  iff  max|out - ref| <= 2 * max|torch_same - ref| + atol_floor
          and  rms(out - ref) / rms(ref) <= 2 * rms(torch_same - ref) / rms(ref) + rms_floor
          and  out has no NaN / inf where ref is finite, and the same +-inf where ref is infinite.

The failure message shows max and mean differences, the budget, and the first mismatching indices.
"""

from __future__ import annotations

import torch

# Floors per kernel dtype: absorb reduction-order noise when the same-dtype run happens to be exact.
ATOL_FLOOR = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
RMS_FLOOR = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt()) if x.numel() else 0.0


def assert_close_to_ref(out: torch.Tensor, ref: torch.Tensor, torch_same: torch.Tensor, name: str,
                        dtype: torch.dtype | None = None, atol_floor: float | None = None,
                        rms_floor: float | None = None) -> dict:
    """Assert ``out`` (kernel) is as close to ``ref`` as ``torch_same`` is, up to 2x plus a floor.

    Args:
        out, ref, torch_same: same shape; any float dtypes (compared in fp64 on the CPU).
        name: label for the message (e.g. ``"dq"``).
        dtype: kernel dtype that picks the default floors (default ``out.dtype``).
        atol_floor, rms_floor: override the floors.

    Returns:
        dict with ``max_err``, ``budget``, ``rel_rms``, ``rms_budget`` (for logging).

    Raises:
        AssertionError: with max/mean diff, the budget and the first mismatching indices.
    """
    assert out.shape == ref.shape == torch_same.shape, (
        f"{name}: shapes differ: kernel {tuple(out.shape)}, ref {tuple(ref.shape)}, torch {tuple(torch_same.shape)}")
    dtype = out.dtype if dtype is None else dtype
    atol_floor = ATOL_FLOOR[dtype] if atol_floor is None else atol_floor
    rms_floor = RMS_FLOOR[dtype] if rms_floor is None else rms_floor
    o, r, t = (x.detach().double().cpu() for x in (out, ref, torch_same))
    fin = torch.isfinite(r)
    # Non-finite reference entries (-inf LSE of empty rows) must be reproduced exactly.
    bad_inf = (~fin) & (o != r)
    bad_nan = fin & ~torch.isfinite(o)
    if bad_inf.any() or bad_nan.any():
        idx = torch.nonzero(bad_inf | bad_nan)[:5].tolist()
        raise AssertionError(f"{name}: non-finite mismatch ({int(bad_nan.sum())} NaN/inf where ref finite, "
                             f"{int(bad_inf.sum())} where ref is +-inf); first indices {idx}, "
                             f"kernel {[float(o[tuple(i)]) for i in idx]}, ref {[float(r[tuple(i)]) for i in idx]}")
    err = torch.where(fin, (o - r).abs(), torch.zeros_like(o))
    terr = torch.where(fin, (t - r).abs(), torch.zeros_like(t))
    max_err, budget = float(err.max()) if err.numel() else 0.0, 0.0
    budget = 2.0 * (float(terr.max()) if terr.numel() else 0.0) + atol_floor
    ref_rms = _rms(torch.where(fin, r, torch.zeros_like(r)))
    if ref_rms > atol_floor:
        rel_rms = _rms(err) / ref_rms
        rms_budget = 2.0 * _rms(terr) / ref_rms + rms_floor
    else:  # an all-zero reference (e.g. dq at S=1): a relative RMS means nothing, the max-abs test decides
        rel_rms, rms_budget = 0.0, rms_floor
    info = dict(max_err=max_err, budget=budget, rel_rms=rel_rms, rms_budget=rms_budget)
    if max_err > budget or rel_rms > rms_budget:
        over = err > budget
        idx = torch.nonzero(over)[:5].tolist() if over.any() else [list(torch.unravel_index(err.argmax(), err.shape))]
        idx = [[int(v) for v in i] for i in idx]
        raise AssertionError(
            f"{name}: max|kernel-ref| = {max_err:.3e} (budget {budget:.3e} = 2 x torch-same-dtype "
            f"{float(terr.max()) if terr.numel() else 0.0:.3e} + floor {atol_floor:.1e}); mean diff "
            f"{float(err.mean()):.3e}; rel RMS {rel_rms:.3e} (budget {rms_budget:.3e}); "
            f"{int(over.sum())} elements over budget, first at {idx}: kernel "
            f"{[float(o[tuple(i)]) for i in idx]}, ref {[float(r[tuple(i)]) for i in idx]}")
    return info
