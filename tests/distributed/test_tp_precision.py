"""Row-parallel reductions in fp32 under bf16 autocast (``tp_fp32_reduce``), 2 gloo processes on CPU.

- Which dtype reaches the collectives: every all-reduce / reduce-scatter of a TP 2 forward + backward of the tiny
  Llama (+ sequence parallel) under ``torch.autocast(cpu, bfloat16)``, for both TP implementations (``local``: c10d
  calls; ``dtensor``: DTensor's functional collectives), is recorded by wrapping ``torch.distributed`` and
  ``torch.distributed._functional_collectives``; with ``tp_fp32_reduce`` nothing is summed in bf16 (and without it
  the row-parallel outputs are, which shows the spy sees them).
- What is reduced: a row-parallel ``Linear`` under autocast returns exactly the fp32 sum of the two ranks' bf16
  partial products (each rank recomputes both partial products itself), and with bf16 reduction that sum rounded
  to bf16.
- Step-0 precision: the whole gradient (un-permuted for ERNIE's fused projections) and the logits of TP 2 bf16
  runs, against the fp32 one-process run, are within 2x the error of the one-process bf16 run (each bf16 run is a
  different rounding of the same products; measured on 2.13 CPU: Llama 7.4e-3 / 7.8e-3 vs 7.6e-3).

Run as a script (``python -m torch.distributed.run --nproc_per_node 2 test_tp_precision.py OUT.json``) this file is
the worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_prec") / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(33500 + (os.getpid() % 1000) * 4), os.path.abspath(__file__), str(out)]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=240)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


@pytest.mark.parametrize("impl", ["local", "dtensor"])
@pytest.mark.parametrize("sp", [False, True])
def test_row_parallel_reductions_run_in_fp32(result, impl, sp):
    on, off = result[f"dtypes_{impl}_fp32_sp{int(sp)}"], result[f"dtypes_{impl}_bf16_sp{int(sp)}"]
    # 2 layers x (o_proj, down_proj) in forward; the spy must see them in both settings
    assert on.get("reduce:torch.float32", 0) >= 4, on
    assert off.get("reduce:torch.bfloat16", 0) >= 4, off
    assert on.get("reduce:torch.bfloat16", 0) == 0, on  # nothing is summed in bf16 once it is on


def test_row_parallel_output_is_exact_fp32_sum_of_bf16_partials(result):
    assert result["exact"]["fp32_dtype"] == "torch.float32" and result["exact"]["fp32_equal"], result["exact"]
    assert result["exact"]["bf16_dtype"] == "torch.bfloat16" and result["exact"]["bf16_equal"], result["exact"]


@pytest.mark.parametrize("impl", ["local", "dtensor"])
@pytest.mark.parametrize("model", ["llama", "ernie"])
@pytest.mark.parametrize("fp32_reduce", [True, False])
def test_tp_bf16_step0_error_like_one_process(result, impl, model, fp32_reduce):
    r = result["precision"][model]
    tp = r[f"tp_{impl}_fp32red{int(fp32_reduce)}"]
    for key in ("grad", "logits"):
        assert tp[key] <= 2 * r["one_bf16"][key], (model, key, tp, r["one_bf16"])
        assert tp[key] > 0  # it did run in bf16


# ---------------------------------------------------------------------------------------------------- worker
def _dims(world, fp32_reduce, sp=False, impl="auto"):
    from paddlenlp_ext.distributed import ParallelDims

    dims = ParallelDims(dp=1, sharding=1, tp=world, world_size=world, sequence_parallel=sp,
                        tensor_parallel_output=sp, tp_fp32_reduce=fp32_reduce, tp_impl=impl)
    dims.build_mesh()
    return dims


def _full_grads(model) -> torch.Tensor:
    """All gradients, gathered and in the natural layout (fused ERNIE projections un-permuted), fp64 ``[P]``."""
    from torch.distributed.tensor import DTensor

    out = []
    for name, p in sorted(model.named_parameters()):
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        layout = getattr(owner, "_tp_fused_layout", {}).get(name.rsplit(".", 1)[-1])
        if layout is not None:
            g = g.index_select(layout[0], torch.argsort(layout[1]))
        out.append(g.detach().double().flatten())
    return torch.cat(out)


def _step0(model, bf16: bool, sp: bool = False):
    from paddlenlp_ext.distributed import loss_parallel_context, to_local_loss
    from worker import make_batch

    b = make_batch(0)
    ctx = loss_parallel_context(SimpleNamespace(tp_enabled=True, tensor_parallel_output=True)) if sp else None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(b["input_ids"], position_ids=b["position_ids"],
                       attn_mask_startend_row_indices=b["attn_mask_startend_row_indices"])
    if ctx is not None:
        with ctx:
            loss = to_local_loss(F.cross_entropy(logits.float().flatten(0, 1), b["labels"].flatten(),
                                                 ignore_index=-100))
            loss.backward()
        logits = logits.full_tensor()
    else:
        F.cross_entropy(logits.float().flatten(0, 1), b["labels"].flatten(), ignore_index=-100).backward()
    return logits.detach().double(), _full_grads(model)


def _collective_dtypes(world, fp32_reduce, sp, impl) -> dict:
    """``{"reduce:<dtype>": calls}`` of every sum collective (DTensor's functional collectives and c10d's) in one
    forward + backward under bf16 autocast."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from paddlenlp_ext.distributed import parallelize_model
    from worker import build_model

    seen: dict = {}
    # reduce_scatter_single (torch 2.13) / reduce_scatter_tensor (older): DTensor's Partial -> Shard
    targets = [(m, n) for m in (funcol, dist) for n in ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single")
               if hasattr(m, n)]
    originals = {(m, n): getattr(m, n) for m, n in targets}

    def spy(orig):
        def call(tensor, *args, **kwargs):
            t = args[0] if orig.__name__ == "reduce_scatter_tensor" and orig.__module__.endswith("c10d") else tensor
            key = f"reduce:{t.dtype}"
            seen[key] = seen.get(key, 0) + 1
            return orig(tensor, *args, **kwargs)
        return call

    model = parallelize_model(build_model(False), _dims(world, fp32_reduce, sp, impl), SimpleNamespace(bf16=False))
    for (m, n), f in originals.items():
        setattr(m, n, spy(f))
    try:
        _step0(model, bf16=True, sp=sp)
    finally:
        for (m, n), f in originals.items():
            setattr(m, n, f)
    return seen


def _exact_sum(world) -> dict:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    from paddlenlp_ext.distributed.tp_styles import rowwise_style

    out = {}
    for fp32 in (True, False):
        torch.manual_seed(0)
        lin = torch.nn.Linear(64, 8, bias=False)
        x = torch.randn(5, 64)
        w = lin.weight.detach().clone()
        parallelize_module(lin, _dims(world, fp32).tp_mesh(), rowwise_style(False, fp32_reduce=fp32,
                                                                            input_layouts=Replicate()))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = lin(x)
            parts = [F.linear(xs, ws) for xs, ws in zip(x.chunk(world, -1), w.chunk(world, -1))]  # bf16 each
        want = sum(p.float() for p in parts)  # rank order, fp32
        tag = "fp32" if fp32 else "bf16"
        out[f"{tag}_dtype"] = str(got.dtype)
        out[f"{tag}_equal"] = bool(torch.equal(got, want if fp32 else want.bfloat16()))
    return out


def _precision(world) -> dict:
    from paddlenlp_ext.distributed import parallelize_model
    from worker import build_model

    res = {}
    for kind in ("llama", "ernie"):
        ref_l, ref_g = _step0(build_model(False, kind), bf16=False)
        r = {}
        l16, g16 = _step0(build_model(False, kind), bf16=True)
        r["one_bf16"] = {"logits": float((l16 - ref_l).norm() / ref_l.norm()), "grad": float((g16 - ref_g).norm() / ref_g.norm())}
        for fp32 in (True, False):
            for impl in ("local", "dtensor"):
                model = parallelize_model(build_model(False, kind), _dims(world, fp32, impl=impl),
                                          SimpleNamespace(bf16=False))
                lt, gt = _step0(model, bf16=True)
                r[f"tp_{impl}_fp32red{int(fp32)}"] = {"logits": float((lt - ref_l).norm() / ref_l.norm()),
                                                      "grad": float((gt - ref_g).norm() / ref_g.norm())}
        res[kind] = r
    return res


def _main(out_path: str) -> None:
    import torch.distributed as dist

    from paddlenlp_ext.distributed import init_distributed

    init_distributed(SimpleNamespace(tensor_parallel_degree=1, sharding_parallel_degree=-1, sharding="stage1"))
    world = dist.get_world_size()
    result = {f"dtypes_{impl}_{'fp32' if f else 'bf16'}_sp{int(sp)}": _collective_dtypes(world, f, sp, impl)
              for impl in ("local", "dtensor") for f in (True, False) for sp in (False, True)}
    result["exact"] = _exact_sum(world)
    result["precision"] = _precision(world)
    if dist.get_rank() == 0:
        json.dump(result, open(out_path, "w"), indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    _main(sys.argv[1])
