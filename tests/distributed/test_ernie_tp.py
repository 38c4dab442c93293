"""ERNIE-3.5-SE under tensor parallelism (gloo, CPU, fp32): the fused ``qkv_gate_up_proj`` / ``o_proj`` split so
each rank holds whole heads and the matching FFN columns (``paddlenlp_ext.distributed.tp_styles``).

Compared with one process on the same global batches (tiny ERNIE of ``worker.py``: head attention layer, one fused
parallel layer, tail FFN layer; hidden 64, 4 heads, intermediate 128): TP 2 (+ sequence parallel + loss parallel;
local compute, and torch's DTensor styles),
FSDP 2 x TP 2, LoRA under TP 2; DCP checkpoints saved under TP 2 and FSDP 2 x TP 2, loaded in one process, under
FSDP 2 and under FSDP 2 x TP 2 (reshard); the gathered HF export and LoRA adapters equal the single-process ones.

Tolerance as ``test_distributed.py``: 4 x the difference between one-process runs with 1 and 2 micro-batches
(fp32 re-association, measured each run) + one fp32 ulp. A wrong layout (permuted checkpoint, heads mixed across
ranks) gives differences of order 1e-2 or more.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from test_distributed import EPS32, _assert_close, _read_dir, _run  # noqa: E402

pytestmark = pytest.mark.distributed

TP = {"sharding": 1, "tp": 2}
FSDP = {"sharding": 2, "sharding_stage": "stage2"}
FSDP_TP = {"sharding": 2, "sharding_stage": "stage3", "tp": 2}
E = {"model": "ernie"}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("ernie_tp")


@pytest.fixture(scope="module")
def runs(tmp):
    """All runs, in dependency order (checkpoints are written before they are loaded); the one-process runs,
    references and loads, go last in one launch."""
    ck_tp, ck_fxt = str(tmp / "ck_tp"), str(tmp / "ck_fxt")
    two = _run([
        {"name": "tp", "layout": TP, "end": 4, **E, "export": str(tmp / "hf_tp"), "record_local_shapes": True,
         "eval_after": True},
        {"name": "init_tp", "layout": TP, "end": 0, **E, "export": str(tmp / "hf_init_tp")},
        {"name": "tp_sp_lp", "layout": {**TP, "sequence_parallel": True, "tensor_parallel_output": True}, "end": 4, **E},
        {"name": "tp_sp_dtensor", "layout": {**TP, "sequence_parallel": True, "tp_impl": "dtensor"}, "end": 4, **E},
        {"name": "save_tp", "layout": TP, "end": 2, "save_at": 2, "save": ck_tp, **E},
        {"name": "fsdp_from_tp", "layout": FSDP, "start": 2, "end": 4, "load": ck_tp, **E},
        {"name": "lora_tp", "layout": TP, "end": 3, "lora": True, **E, "adapters": str(tmp / "lora_tp")},
    ], 2, tmp, "e2")
    four = _run([
        {"name": "fsdp_x_tp", "layout": FSDP_TP, "end": 4, **E},
        {"name": "fsdp_x_tp_sp", "layout": {**FSDP_TP, "sequence_parallel": True}, "end": 4, **E},
        {"name": "fsdp_x_tp_from_tp", "layout": FSDP_TP, "start": 2, "end": 4, "load": ck_tp, **E},
        {"name": "save_fsdp_x_tp", "layout": FSDP_TP, "end": 2, "save_at": 2, "save": ck_fxt, **E},
    ], 4, tmp, "e4")
    one = _run([
        {"name": "ref", "end": 4, **E, "eval_after": True},
        {"name": "init", "end": 0, **E, "export": str(tmp / "hf_init_ref")},
        {"name": "ref_micro2", "end": 4, "micro": 2, **E},
        {"name": "lora", "end": 3, "lora": True, **E, "adapters": str(tmp / "lora_ref")},
        {"name": "one_from_tp", "start": 2, "end": 4, "load": ck_tp, **E},
        {"name": "one_from_fsdp_x_tp", "start": 2, "end": 4, "load": ck_fxt, **E},
        {"name": "reload_tp_export", "from_pretrained": str(tmp / "hf_tp"), "start": 4, "end": 4, "eval_after": True,
         **E},
    ], 1, tmp, "e1")
    return {**one, **two, **four}


@pytest.fixture(scope="module")
def tol(runs):
    noise = max(abs(a - b) / abs(b) for key in ("losses", "grad_norms")
                for a, b in zip(runs["ref_micro2"][key], runs["ref"][key]))
    return 4 * noise + EPS32


def test_fused_projection_is_split(runs):
    """Rank 0 holds half the rows of qkv_gate_up_proj ([3H + 2I, H] = [448, 64]) and half the columns of the fused
    o_proj ([H, I + H] = [64, 192]): real TP, not a replicated fallback."""
    shapes = runs["tp"]["local_shapes"]
    assert shapes["model.layers.1.self_attn_mlp.qkv_gate_up_proj.weight"] == [224, 64]
    assert shapes["model.layers.1.self_attn_mlp.o_proj.weight"] == [64, 96]
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == [32, 64]
    assert shapes["model.layers.2.mlp.down_proj.weight"] == [64, 64]


@pytest.mark.parametrize("name", ["tp", "tp_sp_lp", "tp_sp_dtensor", "fsdp_x_tp", "fsdp_x_tp_sp"])
def test_ernie_tp_matches_one_process(runs, tol, name):
    _assert_close(runs[name], runs["ref"], tol)


@pytest.mark.parametrize("name", ["one_from_tp", "fsdp_from_tp", "fsdp_x_tp_from_tp", "one_from_fsdp_x_tp"])
def test_ernie_tp_checkpoint_reshards(runs, tol, name):
    """DCP checkpoints hold the natural (unpermuted) layout of model and AdamW states: saved under TP 2 or
    FSDP 2 x TP 2, loaded under another layout, the run continues with the single process's losses."""
    _assert_close(runs["save_tp"], runs["ref"], tol, 0, 2)
    _assert_close(runs["save_fsdp_x_tp"], runs["ref"], tol, 0, 2)
    _assert_close(runs[name], runs["ref"], tol, 2, 4)


def test_ernie_tp_export_equals_single_process(runs, tmp, tol):
    """The gathered HF export under TP 2 is in the single process's (unpermuted) layout.

    Before training the two exports are bitwise equal (gathering and un-permuting involve no arithmetic). After 4
    steps the TP export, reloaded in one process, gives the TP run's loss on the next batch, which equals the
    single process's within ``tol`` (a permuted row order would change the loss at the first digits).
    """
    want, got = _read_dir(tmp / "hf_init_ref"), _read_dir(tmp / "hf_init_tp")
    assert got.keys() == want.keys() and any("qkv_gate_up_proj" in k for k in want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    tp_eval, ref_eval = runs["tp"]["eval_loss"], runs["ref"]["eval_loss"]
    assert abs(runs["reload_tp_export"]["eval_loss"] - tp_eval) <= tol * tp_eval
    assert abs(tp_eval - ref_eval) <= tol * ref_eval


def test_ernie_lora_tp_adapters_whole(runs, tol, tmp):
    """LoRA on the fused projections under TP 2: losses equal one process and the saved adapters (lora_B rows of
    qkv_gate_up_proj, lora_A columns of o_proj) are whole and unpermuted."""
    _assert_close(runs["lora_tp"], runs["lora"], tol)
    want, got = _read_dir(tmp / "lora_ref"), _read_dir(tmp / "lora_tp")
    assert got.keys() == want.keys() and any("qkv_gate_up_proj" in k for k in want)
    for k in want:
        assert got[k].shape == want[k].shape, k
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
