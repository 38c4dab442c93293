"""``tune_blocks`` helpers that run without a GPU: argument stripping, config parsing and the across-process
aggregation."""

import pytest
import torch

from flashmask.benchmarks.tune_blocks import BWD_KEYS, FWD_KEYS, _strip, aggregate, parse_config


def test_strip_removes_flags_and_values():
    argv = ["--seq", "8192", "--processes", "3", "--json=x.json", "--masks", "a,b", "--json", "y.json"]
    assert _strip(argv, ("--processes", "--json")) == ["--seq", "8192", "--masks", "a,b"]


def test_parse_config_names_the_keys_and_refuses_a_wrong_count():
    assert parse_config("128,64,8,3", FWD_KEYS) == dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    assert parse_config("64,128,8,3,128,64,8,3", BWD_KEYS)["DQ_BLOCK_M"] == 128
    with pytest.raises(ValueError, match="'128,64,8'.*4 comma-separated integers"):
        parse_config("128,64,8", FWD_KEYS)


def test_aggregate_takes_medians_per_job_and_mask():
    def run(a, b):
        return [{"variant": "new", "kind": "bwd", "config": "c", "ms": {"m1": a, "m2": b}}]

    rows = aggregate([run(1.0, 5.0), run(3.0, 4.0), run(2.0, 9.0)], ["m1", "m2"])
    assert rows[0]["ms"] == {"m1": 2.0, "m2": 5.0}
    assert rows[0]["ms_per_process"] == {"m1": [1.0, 3.0, 2.0], "m2": [5.0, 4.0, 9.0]}
    assert rows[0]["config"] == "c" and rows[0]["kind"] == "bwd"


def test_processes_children_run_one_sweep_even_with_abbreviated_flags(monkeypatch, tmp_path):
    """``--proc 2`` (argparse abbreviation) must not reach the children: each would spawn 2 more, without end."""
    import json
    import subprocess

    from flashmask.benchmarks import tune_blocks

    children = []

    def fake_run(cmd, check):
        argv = cmd[3:]  # [python, -m, module, *argv]
        children.append(argv)
        out = argv[len(argv) - 1 - argv[::-1].index("--json") + 1]
        with open(out, "w") as f:
            json.dump({"rows": [{"variant": "new", "kind": "fwd", "config": "c", "ms": {"m1": 1.0}}]}, f)

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(tune_blocks.torch.cuda, "is_available", lambda: True)  # a GPU machine (children faked)
    rows = tune_blocks.main(["--proc", "2", "--masks", "m1", "--js", str(tmp_path / "x.json")])
    assert len(children) == 2 and rows[0]["ms"] == {"m1": 1.0}

    class Sweep(Exception):
        pass

    def one_sweep(args):
        raise Sweep(args.processes, args.json)

    monkeypatch.setattr(tune_blocks, "_jobs", one_sweep)  # a child that runs its own sweep stops here
    for argv in children:
        with pytest.raises(Sweep) as e:
            tune_blocks.main(argv)
        assert e.value.args[0] == 1 and e.value.args[1] != str(tmp_path / "x.json")


def test_device_fn_calls_the_kernels_with_prebuilt_mask_vectors():
    """``--timing gpu`` times ``forward`` / ``backward`` directly with the mask vectors built once outside the
    graph; the backward runs the reproducible Triton kernels (``deterministic=True``)."""
    import types

    from flashmask.benchmarks.tune_blocks import _device_fn

    calls = []
    mod = types.SimpleNamespace(
        mask_vectors=lambda sri, causal, s_q, s_k, dev: calls.append(("mv", sri, causal, s_q, s_k)) or "MV",
        forward=lambda q, k, v, mv, causal, scale: calls.append(("fwd", mv, causal, scale)) or ("O", "LSE"),
        backward=lambda do, q, k, v, o, lse, dlse, mv, causal, scale, det: calls.append(("bwd", o, lse, dlse, mv,
                                                                                          det)),
    )
    import torch

    q = torch.zeros(1, 5, 2, 4)
    k = torch.zeros(1, 7, 1, 4)
    _device_fn(mod, "fwd", q, k, k, q, "SRI", True, 0.5)()
    assert calls == [("mv", "SRI", True, 5, 7), ("fwd", "MV", True, 0.5)]
    calls.clear()
    fn = _device_fn(mod, "bwd", q, k, k, q, None, False, 0.5)
    fn()
    fn()
    assert calls[-2:] == [("bwd", "O", "LSE", None, "MV", True)] * 2
    assert [c[0] for c in calls] == ["mv", "fwd", "bwd", "bwd"]  # preprocessing and forward once, outside


def test_import_variant_exposes_this_checkouts_kernels():
    from flashmask import autograd, dispatch, launch_config, mask_cache
    from flashmask.benchmarks.tune_blocks import _import_variant

    mod = _import_variant(None)
    assert (mod.forward, mod.backward, mod.mask_vectors) == (dispatch.forward, dispatch.backward,
                                                             mask_cache.mask_vectors)
    assert mod.attention is autograd.flashmask_attention_triton and mod.tile_override is launch_config.tile_override


def test_tile_override_applies_on_gpu_only_and_is_restored():
    from flashmask.launch_config import bwd_config, fwd_config, tile_override

    tuned = fwd_config(128, torch.bfloat16, True)
    cfg = dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)
    with tile_override(fwd=cfg):
        assert fwd_config(128, torch.bfloat16, True) == cfg
        assert fwd_config(128, torch.float32, False)["BLOCK_M"] == 16  # the interpreter keeps its tiles
        assert bwd_config(128, torch.bfloat16, True)["BLOCK_N"] == 128  # only what was given is overridden
    assert fwd_config(128, torch.bfloat16, True) == tuned
