"""Single-process tests of the layout rules, config checks (the sequence-parallel length check among them) and the
world-size-1 no-op path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from paddlenlp_ext.distributed import (ParallelDims, all_reduce_sum_dp, dp_rank, dp_slice, dp_world_size,
                                       init_distributed, loss_parallel_context, parallelize_model, parse_sharding)


def dims(**kw):
    kw.setdefault("dp", -1)
    kw.setdefault("sharding", -1)
    kw.setdefault("tp", -1)
    return ParallelDims(**kw)


@pytest.mark.parametrize("world,tp,stage,want", [
    (8, 2, "stage2", (1, 4, 2)),   # PaddleNLP sft.json on 8 GPUs: sharding takes what TP leaves
    (8, 4, "stage2", (1, 2, 4)),   # dpo.json
    (8, 2, None, (4, 1, 2)),       # no sharding: plain data parallel takes the rest
    (1, -1, "stage1", (1, 1, 1)),
])
def test_paddle_degree_resolution(world, tp, stage, want):
    d = dims(world_size=world, tp=tp, sharding_stage=stage)
    assert (d.dp, d.sharding, d.tp) == want
    assert d.batch_world_size == want[0] * want[1]


def test_product_mismatch_names_every_number():
    with pytest.raises(ValueError) as e:
        dims(world_size=8, dp=1, sharding=2, tp=2, sharding_stage="stage1")
    msg = str(e.value)
    for s in ("data_parallel_degree(1)", "sharding_parallel_degree(2)", "tensor_parallel_degree(2)", "= 4",
              "world_size = 8"):
        assert s in msg


def test_sharding_degree_without_stage_and_sp_without_tp():
    with pytest.raises(ValueError, match="`sharding` is empty"):
        dims(world_size=2, sharding=2)
    with pytest.raises(ValueError, match="sequence_parallel=True needs tensor_parallel_degree > 1"):
        dims(world_size=2, sharding_stage="stage2", sequence_parallel=True)
    with pytest.raises(ValueError, match="must be >= 1"):
        dims(world_size=2, tp=0)


def test_model_config_checks():
    cfg = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    dims(world_size=2, tp=2).check_model_config(cfg)
    with pytest.raises(ValueError) as e:
        dims(world_size=4, tp=4).check_model_config(cfg)
    assert "num_key_value_heads=2 is not divisible by tensor_parallel_degree=4" in str(e.value)
    assert "fewer KV heads than TP ranks" in str(e.value)
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by tensor_parallel_degree=3"):
        dims(world_size=3, tp=3).check_model_config(cfg)


def test_parse_sharding():
    assert parse_sharding("stage2") == ("stage2", False)
    assert parse_sharding("stage3 offload") == ("stage3", True)
    assert parse_sharding(["stage1"]) == ("stage1", False)
    assert parse_sharding("") == (None, False)
    with pytest.raises(ValueError, match="needs a stage"):
        parse_sharding("offload")
    with pytest.raises(ValueError, match="unknown or repeated"):
        parse_sharding("stage4")


def test_world_size_one_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    d = init_distributed(SimpleNamespace(tensor_parallel_degree=-1, sharding="stage2", sharding_parallel_degree=-1))
    assert d.mesh is None and d.world_size == 1 and (d.dp, d.sharding, d.tp) == (1, 1, 1)
    model = torch.nn.Linear(2, 2)
    assert parallelize_model(model, d) is model
    assert dp_rank(d) == 0 and dp_world_size(d) == 1 and dp_slice(4, d) == slice(0, 4)
    t = torch.tensor(7)
    assert int(all_reduce_sum_dp(t, d)) == 7
    with loss_parallel_context(d):
        pass


def test_dp_slice_rejects_uneven_batch():
    d = dims(world_size=1)
    d.dp = 3  # pretend: no mesh needed for the size check
    with pytest.raises(ValueError, match="does not split over data-parallel world size 3"):
        dp_slice(4, d)


def test_rank_major_index_puts_each_ranks_blocks_together():
    """ERNIE's fused rows [QKV 3H | G I | U I] (H=4, I=2 here, tp 2): rank r's slice = [QKV_r | G_r | U_r]."""
    from paddlenlp_ext.distributed.tp_styles import rank_major_index

    idx = rank_major_index([12, 2, 2], 2)
    assert idx.tolist() == [0, 1, 2, 3, 4, 5, 12, 14, 6, 7, 8, 9, 10, 11, 13, 15]
    assert sorted(idx.tolist()) == list(range(16))
    assert rank_major_index([12, 2, 2], 1).tolist() == list(range(16))  # TP 1: natural order


def test_rank_major_index_rejects_uneven_block():
    from paddlenlp_ext.distributed.tp_styles import rank_major_index

    with pytest.raises(ValueError, match=r"block 1 of size 3 is not divisible by tensor_parallel_degree=2"):
        rank_major_index([12, 3, 3], 2)


def test_pipeline_parallel_rejected(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="`pipeline_parallel_degree`=2: pipeline, sep and context parallelism"):
        init_distributed(SimpleNamespace(pipeline_parallel_degree=2))
    init_distributed(SimpleNamespace(pipeline_parallel_degree=1, sep_parallel_degree=-1))


def test_product_mismatch_with_derived_replicas_names_no_unset_key():
    """The launchers leave the data-parallel degree at -1 (it is not a config key): the message calls it derived
    instead of naming data_parallel_degree, which a user cannot set."""
    with pytest.raises(ValueError) as e:
        dims(world_size=3, dp=-1, sharding=-1, tp=2)
    msg = str(e.value)
    assert "data_parallel_degree" not in msg and "1 data-parallel replica(s) (derived)" in msg
    assert "tensor_parallel_degree(2)" in msg and "world_size = 3" in msg


@pytest.mark.parametrize("tp,given,want", [(2, None, True), (4, None, True), (2, False, False), (2, True, True),
                                           (1, None, False)])
def test_tp_fp32_reduce_default_is_fp32_under_tp(tp, given, want):
    """``tp_fp32_reduce=None`` sums row-parallel partials in fp32 for every TP degree (at TP 2 on two H200s the
    bf16 sums drift further from one GPU at the same speed; docs/distributed_gpu_results.md); False keeps bf16."""
    from paddlenlp_ext.distributed.parallelize import _fp32_reduce

    assert _fp32_reduce(SimpleNamespace(tp=tp, tp_fp32_reduce=given)) is want


def test_sequence_parallel_odd_length_error_names_the_keys():
    """``sequence_parallel`` with ``zero_padding: false``: batches are padded to their longest row, and an odd length
    cannot be split over 2 ranks; the error names the keys that pad batches to an even length (checked:
    ``pad_to_multiple_of: 2`` then trains 6 steps under TP 2)."""
    from paddlenlp_ext.distributed.parallelize import _check_sequence_divisible

    hook = _check_sequence_divisible(2)
    hook(None, (torch.zeros(1, 44, dtype=torch.long),), {})  # even: passes
    with pytest.raises(ValueError, match=r"sequence length 45 .* zero_padding: true \(packs\) or "
                                         r"pad_to_max_length: true, else pad_to_multiple_of: 2"):
        hook(None, (torch.zeros(1, 45, dtype=torch.long),), {})
