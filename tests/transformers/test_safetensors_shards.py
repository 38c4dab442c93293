"""Sharded safetensors: transformers' layout written by huggingface_hub, one index reader for every model."""

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file as save_numpy

from paddlenlp_ext.transformers.ernie35 import Ernie35Config, Ernie35ForCausalLM, save_paddle_checkpoint
from paddlenlp_ext.transformers.ernie35.paddle_import import load_checkpoint_state_dict
from paddlenlp_ext.transformers.model_utils import (WEIGHTS_INDEX_NAME, WEIGHTS_NAME, load_state_dict,
                                                    save_state_dict, weight_files)


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {f"layer.{i}.weight": torch.randn(10, 10, generator=g) for i in range(5)} | {
        "big.weight": torch.randn(40, 10, generator=g), "steps": torch.arange(3)}


def test_shards_index_and_names_follow_transformers_layout(tmp_path):
    sd = _tensors()
    names = save_state_dict(sd, str(tmp_path), max_shard_bytes=1000)  # 400-byte layers, a 1600-byte tensor
    on_disk = sorted(os.listdir(tmp_path))
    assert sorted(names) == on_disk and WEIGHTS_INDEX_NAME in on_disk and WEIGHTS_NAME not in on_disk
    shards = [n for n in names if n != WEIGHTS_INDEX_NAME]
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    index = json.loads((tmp_path / WEIGHTS_INDEX_NAME).read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in sd.values())
    assert set(index["weight_map"]) == set(sd) and set(index["weight_map"].values()) == set(shards)
    for shard in shards:
        with safe_open(str(tmp_path / shard), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}  # what transformers checks before loading
            size = sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
            assert size <= 1000 or list(f.keys()) == ["big.weight"]  # a tensor over the limit: a shard of its own
    back = load_state_dict(str(tmp_path))
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_small_state_dict_is_one_file(tmp_path):
    assert save_state_dict(_tensors(), str(tmp_path)) == [WEIGHTS_NAME]
    assert os.listdir(tmp_path) == [WEIGHTS_NAME]
    assert weight_files(str(tmp_path)) == [str(tmp_path / WEIGHTS_NAME)]


def test_index_without_weight_map_names_the_file(tmp_path):
    (tmp_path / WEIGHTS_INDEX_NAME).write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match=f"{WEIGHTS_INDEX_NAME}: not a safetensors index"):
        weight_files(str(tmp_path))


def test_index_naming_a_missing_shard_is_refused(tmp_path):
    shard = save_state_dict(_tensors(), str(tmp_path), max_shard_bytes=1000)[1]
    os.remove(tmp_path / shard)
    with pytest.raises(FileNotFoundError, match=shard):
        load_state_dict(str(tmp_path))


def _tiny_ernie():
    torch.manual_seed(0)
    cfg = Ernie35Config.from_pretrained("ernie/tiny-random-ernie", hidden_size=32, intermediate_size=48,
                                        num_attention_heads=4, num_hidden_layers=2, vocab_size=97,
                                        max_position_embeddings=64, use_bias=True, enable_random_position_ids=False)
    return Ernie35ForCausalLM(cfg).eval()


def test_ernie_import_reads_our_sharded_save(tmp_path):
    """One shard may hold only ``lm_head.*``: the layout is decided over all shards, not per file."""
    model = _tiny_ernie()
    model.save_pretrained(str(tmp_path), max_shard_bytes=20_000)
    assert len(weight_files(str(tmp_path))) > 1
    got = load_checkpoint_state_dict(str(tmp_path), model.config)
    ref = model.state_dict()
    assert all(torch.equal(got[k], ref[k]) for k in ref if k in got) and set(ref) - set(got) <= {"lm_head.weight"}
    loaded = Ernie35ForCausalLM.from_pretrained(str(tmp_path))
    ids = torch.randint(1, 97, (1, 6))
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


def test_ernie_import_reads_sharded_paddle_safetensors(tmp_path):
    """PaddleNLP's layout (``ernie.*`` keys, numpy files) split over two shards with an index."""
    model = _tiny_ernie()
    save_paddle_checkpoint(model, str(tmp_path / "one"), fmt="safetensors")
    single = load_checkpoint_state_dict(str(tmp_path / "one"), model.config)
    with safe_open(str(tmp_path / "one" / WEIGHTS_NAME), framework="np") as f:
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    keys = sorted(arrays)
    parts = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    out = tmp_path / "sharded"
    out.mkdir()
    for name, part in parts.items():
        save_numpy({k: arrays[k] for k in part}, str(out / name), metadata={"format": "np"})
    (out / WEIGHTS_INDEX_NAME).write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: name for name, part in parts.items() for k in part}}))
    (out / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
    got = load_checkpoint_state_dict(str(out), model.config)
    assert set(got) == set(single) and all(torch.equal(got[k], single[k]) for k in single)


def test_views_into_one_buffer_are_saved_as_their_own_tensors(tmp_path):
    """Parameters gathered into one flat buffer (FSDP, a fused weight's slices) save and reload unchanged."""
    from safetensors.torch import load_file

    from paddlenlp_ext.transformers.model_utils import save_state_dict

    flat = torch.arange(20, dtype=torch.float32)
    sd = {"a.weight": flat[:12].view(3, 4), "score.weight": flat[12:].view(2, 4)}
    save_state_dict(sd, str(tmp_path))
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert set(loaded) == set(sd)
    for k in sd:
        torch.testing.assert_close(loaded[k], sd[k])
