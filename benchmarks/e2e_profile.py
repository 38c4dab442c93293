"""``--profile`` of ``benchmarks/e2e_train.py``: where a training step's time goes.

``torch.profiler`` records ``steps`` training steps (after the caller's warm-up) and this module ranks the
kernels by total device time: on CUDA the GPU kernels (``DeviceType.CUDA`` events, self device time), on CPU
(``--tiny``) the CPU operators (self CPU time), so the smoke test exercises the same code.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def _device_time(evt, cuda: bool) -> float:
    """Self time of an averaged event in microseconds (device time on CUDA; names differ across torch versions)."""
    if not cuda:
        return float(evt.self_cpu_time_total)
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(evt, name):
            return float(getattr(evt, name))
    return 0.0


def profile_steps(step_fn, n_steps: int, device: torch.device, top: int = 25) -> dict:
    """Run ``step_fn(i)`` for ``i in range(n_steps)`` under the profiler; return the top kernels.

    Returns:
        ``{"device": "cuda"|"cpu", "steps": n, "total_ms": float, "top": [{"name", "calls", "ms", "pct"}]}``
        with ``ms`` the summed self time over the profiled steps and ``pct`` its share of ``total_ms`` (all
        kernels' self time).
    """
    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for i in range(n_steps):
            step_fn(i)
        if cuda:
            torch.cuda.synchronize(device)
    events = prof.key_averages()

    def collect(want_dev: bool | None):
        out = []
        for evt in events:
            is_dev = str(getattr(evt, "device_type", "")).endswith("CUDA")
            if want_dev is not None and is_dev != want_dev:
                continue
            t = _device_time(evt, cuda)
            if t > 0:
                out.append((evt.key, int(evt.count), t))
        return out

    rows = collect(cuda)
    if cuda and not rows:  # a torch whose averaged events carry no device type: every event with device time
        rows = collect(None)
    total = sum(r[2] for r in rows) or 1.0
    rows.sort(key=lambda r: -r[2])
    top_rows = [{"name": n[:160], "calls": c, "ms": t / 1e3, "pct": 100.0 * t / total} for n, c, t in rows[:top]]
    return {"device": device.type, "steps": n_steps, "total_ms": total / 1e3, "top": top_rows}


def format_profile(res: dict) -> str:
    """Markdown table of :func:`profile_steps`' result."""
    head = (f"Top {len(res['top'])} {'CUDA kernels' if res['device'] == 'cuda' else 'CPU ops'} over "
            f"{res['steps']} steps (total {res['total_ms']:.1f} ms of kernel self time)")
    lines = [head, "", "| kernel | calls | ms | % |", "|---|---|---|---|"]
    for r in res["top"]:
        name = r["name"].replace("|", "/")
        name = name if len(name) <= 100 else name[:97] + "..."
        lines.append(f"| {name} | {r['calls']} | {r['ms']:.2f} | {r['pct']:.1f} |")
    return "\n".join(lines)
