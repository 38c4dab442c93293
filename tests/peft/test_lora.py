"""LoRA: PEFT-format round trips, merge (tied heads included), freezing, optimizer-state size, configuration
handling, loading an adapter (its own rank and alpha; a base that moved)."""

import copy
import json
import logging
import math
import shutil

import pytest
import torch
import transformers
from torch import nn

from paddlenlp_ext.peft import (
    LoRAConfig,
    LoRALinear,
    apply_lora,
    cast_frozen_base,
    disable_lora,
    load_lora,
    lora_param_groups,
    lora_state_dict,
    merge_lora,
    load_merged_lora,
    save_lora,
)
from paddlenlp_ext.transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from tests.trl._tiny import make_tiny_model_dir

V = 64


def hf_tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg).eval()


def randomize_adapters(model, seed=1, std=0.2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, LoRALinear):
                mod.lora_B.weight.copy_(torch.randn(mod.lora_B.weight.shape, generator=g) * std)
    return model


def logits(model, ids):
    out = model(ids)
    return out.logits if hasattr(out, "logits") else out


def test_scaling_defaults_follow_paddlenlp():
    assert LoRAConfig(r=8).scaling == 2.0  # lora_alpha = 2 r
    assert LoRAConfig(r=16, rslora=True).scaling == pytest.approx(4 / math.sqrt(16))  # alpha = 4, / sqrt(r)
    assert LoRAConfig(r=8, lora_alpha=32).scaling == 4.0  # honoured (PaddleNLP has no such key)
    assert LoRAConfig.from_args({"lora_rank": 4, "lora_alpha": -1}).lora_alpha == 8.0
    with pytest.raises(ValueError, match="lora_rank"):
        LoRAConfig(r=0)


def test_adapter_loads_in_peft_with_equal_logits(tmp_path):
    peft = pytest.importorskip("peft")
    base = hf_tiny_llama()
    ours = randomize_adapters(apply_lora(copy.deepcopy(base), {"lora_rank": 4, "rslora": True}))
    save_lora(ours, str(tmp_path))
    conf = json.loads((tmp_path / "adapter_config.json").read_text())
    assert conf["r"] == 4 and conf["lora_alpha"] == 4.0 and conf["use_rslora"] is True
    assert set(conf["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"}
    ref = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path)).eval()
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        got, want, plain = logits(ours, ids), logits(ref, ids), logits(base, ids)
    assert (want - plain).abs().max() > 1e-3  # the adapter does something
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # same modules, same fp32 ops


def test_peft_adapter_loads_into_ours(tmp_path):
    peft = pytest.importorskip("peft")
    base = hf_tiny_llama()
    cfg = peft.LoraConfig(r=4, lora_alpha=12, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0,
                          init_lora_weights=False)  # random B
    pm = peft.get_peft_model(copy.deepcopy(base), cfg).eval()
    pm.save_pretrained(str(tmp_path))
    ours = load_lora(copy.deepcopy(base), str(tmp_path))
    assert sum(isinstance(m, LoRALinear) for m in ours.modules()) == 2 * 3
    ids = torch.randint(0, V, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(logits(ours, ids), logits(pm, ids), rtol=0, atol=0)
    # lora_path in the launcher arguments goes through the same loader
    again = apply_lora(copy.deepcopy(base), {"lora": True, "lora_path": str(tmp_path)})
    with torch.no_grad():
        torch.testing.assert_close(logits(again, ids), logits(pm, ids), rtol=0, atol=0)


def test_our_llama_adapter_in_peft_on_hf_llama(tmp_path):
    """Adapter trained on our Llama (HF names) loads with PEFT onto transformers' Llama; logits agree to the
    tolerance that the two base models already agree to (same fp32)."""
    peft = pytest.importorskip("peft")
    from paddlenlp_ext.transformers.llama import LlamaForCausalLM

    base = hf_tiny_llama()
    base.save_pretrained(str(tmp_path / "base"))
    ours = LlamaForCausalLM.from_pretrained(str(tmp_path / "base")).eval()
    ids = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        floor = (logits(ours, ids) - logits(base, ids)).abs().max().item()
    ours = randomize_adapters(apply_lora(ours, {"lora_rank": 4}))
    save_lora(ours, str(tmp_path / "adapter"))
    ref = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        diff = (logits(ours, ids) - logits(ref, ids)).abs().max().item()
    assert diff <= 4 * floor + 1e-6, (diff, floor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_folds_in_fp32_and_rounds_once(dtype):
    torch.manual_seed(0)
    model = randomize_adapters(apply_lora(hf_tiny_llama().to(dtype), {"lora_rank": 4, "lora_alpha": 12}))
    lin = model.model.layers[0].self_attn.q_proj
    assert lin.scaling == 3.0 and lin.lora_A.weight.dtype == torch.float32 and lin.weight.dtype == dtype
    expect_w = (lin.weight.float() + (lin.lora_B.weight.float() @ lin.lora_A.weight.float()) * 3.0).to(dtype)
    ids = torch.randint(0, V, (2, 8))
    with torch.no_grad():
        unmerged = logits(model, ids).float()
        with disable_lora(model):
            base_out = logits(model, ids).float()
        merged_model = merge_lora(model)
        assert type(merged_model.model.layers[0].self_attn.q_proj) is nn.Linear
        assert torch.equal(merged_model.model.layers[0].self_attn.q_proj.weight, expect_w)
        merged = logits(merged_model, ids).float()
    if dtype == torch.float32:
        torch.testing.assert_close(merged, unmerged, rtol=1e-5, atol=1e-5)
    else:  # merged rounds W + dW once; unmerged rounds the adapter output: compare to the base-vs-adapter gap
        gap = (unmerged - base_out).abs().max()
        assert (merged - unmerged).abs().max() < 0.1 * gap
    assert not any("lora" in k for k in merged_model.state_dict())


def test_merge_on_eval_is_exact_and_disable_lora_unmerges():
    model = randomize_adapters(apply_lora(hf_tiny_llama(), LoRAConfig(r=2, merge_on_eval=True)))
    lin = model.model.layers[1].mlp.down_proj
    w0 = lin.weight.detach().clone()
    ids = torch.randint(0, V, (1, 6))
    with torch.no_grad():
        model.train()
        unmerged = logits(model, ids)
        model.eval()
        assert lin.merged and not torch.equal(lin.weight, w0)
        torch.testing.assert_close(logits(model, ids), unmerged, rtol=1e-5, atol=1e-5)
        with disable_lora(model):
            assert not lin.merged and torch.equal(lin.weight, w0)
        assert lin.merged
        model.train()
        assert torch.equal(lin.weight, w0)


def test_only_adapter_parameters_change_during_training():
    model = apply_lora(hf_tiny_llama(), {"lora_rank": 4})
    model.train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(lora_param_groups(model, 1e-2, lora_plus_scale=4.0))
    assert opt.param_groups[1]["lr"] == pytest.approx(4e-2)
    for _ in range(2):
        ids = torch.randint(0, V, (2, 8))
        loss = nn.functional.cross_entropy(logits(model, ids)[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
        loss.backward()
        assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)
        opt.step()
        opt.zero_grad()
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {k for k in before if "lora_" in k}  # every adapter tensor moved, nothing else


def _adam_state_bytes(model):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt.step()
    return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if t.dim() > 0)


def test_optimizer_state_scales_with_adapter_size():
    full = _adam_state_bytes(hf_tiny_llama())
    sizes = {}
    for r in (2, 4, 8):
        m = apply_lora(hf_tiny_llama(), {"lora_rank": r})
        n_adapter = sum(p.numel() for p in lora_state_dict(m).values())
        sizes[r] = _adam_state_bytes(m)
        assert sizes[r] == 2 * 4 * n_adapter  # exp_avg + exp_avg_sq, fp32
    assert sizes[4] == 2 * sizes[2] and sizes[8] == 2 * sizes[4]
    n_all = sum(p.numel() for p in hf_tiny_llama().parameters())
    assert full == 2 * 4 * n_all and sizes[8] < full


def test_smollm2_rank8_trainable_fraction_on_meta():
    """SmolLM2-135M geometry (30 layers, hidden 576, FFN 1536, 9/3 heads, tied 49152 vocab), built on meta."""
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    with torch.device("meta"):
        m = apply_lora(transformers.LlamaForCausalLM(cfg), {"lora_rank": 8})
    base = sum(p.numel() for n, p in m.named_parameters() if "lora_" not in n)
    lora = sum(p.numel() for n, p in m.named_parameters() if "lora_" in n)
    per_layer = 8 * ((576 + 576) * 2 + (576 + 192) * 2 + (576 + 1536) * 3)
    assert base == 134_515_008 and lora == 30 * per_layer == 2_442_240
    assert lora / (base + lora) == pytest.approx(0.01783, abs=1e-5)


def test_bf16_base_fp32_adapters_forward_backward():
    model = cast_frozen_base(apply_lora(hf_tiny_llama(), {"lora_rank": 2}), torch.bfloat16)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert all(d == (torch.float32 if "lora_" in n else torch.bfloat16) for n, d in dtypes.items())
    out = logits(model, torch.randint(0, V, (1, 5)))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    lin = model.model.layers[0].self_attn.v_proj
    assert lin.lora_B.weight.grad.dtype == torch.float32 and lin.weight.grad is None


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="no nn.Linear module matches"):
        apply_lora(hf_tiny_llama(), {"lora_target_modules": [".*nothing.*"]})
    m = apply_lora(hf_tiny_llama(), {"lora_rank": 2})
    with pytest.raises(ValueError, match="already has LoRA"):
        apply_lora(m, {})
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_lora(hf_tiny_llama(), str(tmp_path))
    save_lora(m, str(tmp_path))
    other = apply_lora(hf_tiny_llama(), {"lora_rank": 2, "lora_target_modules": [".*q_proj"]})
    with pytest.raises(ValueError, match="unknown"):
        load_lora(other, str(tmp_path))


def test_target_modules_choice():
    m = apply_lora(hf_tiny_llama(), {"lora_rank": 2, "lora_target_modules": [".*q_proj", ".*v_proj"]})
    names = {n.rsplit(".", 1)[-1] for n, mod in m.named_modules() if isinstance(mod, LoRALinear)}
    assert names == {"q_proj", "v_proj"}
    assert not isinstance(m.lm_head, LoRALinear)


def test_paddlenlp_flashmask_lora_config_gives_paddlenlp_scaling():
    """config/llama/flashmask/lora.json (PaddleNLP's file) parses; its LoRA is rank 8, alpha 16 (scaling 2), all
    linear layers."""
    import os

    from tests._scripts import ROOT, load_script

    mod = load_script("llm/run_finetune.py")
    root = str(ROOT)
    for path in ("config/llama/flashmask/lora.json", "config/smollm2/lora.json"):
        model_args, _, _, _ = mod.parse_args([os.path.join(root, path)])
        cfg = LoRAConfig.from_args(model_args)
        assert model_args.lora and cfg.r == 8 and cfg.lora_alpha == 16 and cfg.scaling == 2.0
        m = apply_lora(hf_tiny_llama(), model_args)
        wrapped = {n.rsplit(".", 1)[-1] for n, x in m.named_modules() if isinstance(x, LoRALinear)}
        assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_save_is_atomic_a_failed_save_keeps_the_previous_adapter(tmp_path, monkeypatch):
    """A save killed mid-write (here: save_file writes half the bytes, then raises) leaves the earlier adapter
    under the final names intact and no temporary directory behind."""
    import safetensors.torch

    out = tmp_path / "adapter"
    model = randomize_adapters(apply_lora(hf_tiny_llama(), {"lora_rank": 2}))
    save_lora(model, str(out), base_model_name_or_path="base")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_save = safetensors.torch.save_file

    def killed_save(tensors, filename, metadata=None):
        real_save(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:  # a truncated file under whatever name the writer chose
            f.truncate(100)
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(safetensors.torch, "save_file", killed_save)
    randomize_adapters(model, seed=7)
    with pytest.raises(KeyboardInterrupt):
        save_lora(model, str(out), base_model_name_or_path="base")
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]  # the temporary sibling is removed
    monkeypatch.undo()
    load_lora(hf_tiny_llama(), str(out))  # still a complete adapter
    fresh = tmp_path / "fresh"
    monkeypatch.setattr(safetensors.torch, "save_file", killed_save)
    with pytest.raises(KeyboardInterrupt):
        save_lora(model, str(fresh))
    assert not fresh.exists()  # a new directory appears only complete


def test_saved_base_path_is_absolute_for_local_dirs(tmp_path, monkeypatch):
    """adapter_config.json names an existing local base directory by its absolute path, so the adapter loads
    from any working directory; hub ids and non-existing paths are kept as given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints" / "base_sft").mkdir(parents=True)
    model = apply_lora(hf_tiny_llama(), {"lora_rank": 2})
    cases = {"checkpoints/base_sft": str(tmp_path / "checkpoints" / "base_sft"),
             "HuggingFaceTB/SmolLM2-135M-Instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
             "not/here": "not/here"}
    for i, (given, stored) in enumerate(cases.items()):
        save_lora(model, f"out{i}", base_model_name_or_path=given)
        conf = json.loads((tmp_path / f"out{i}" / "adapter_config.json").read_text())
        assert conf["base_model_name_or_path"] == stored


def test_lora_path_loads_the_adapters_rank_and_alpha_and_warns_about_differing_keys(tmp_path, caplog):
    # PaddleNLP's LoRAModel.from_pretrained uses the adapter's own r / lora_alpha; differing keys are named
    base = make_tiny_model_dir(str(tmp_path / "base"))
    save_lora(apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 4, "lora_alpha": 8}),
              str(tmp_path / "lora"), base_model_name_or_path=base)
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.peft.lora"):
        model = apply_lora(AutoModelForCausalLM.from_pretrained(base),
                           {"lora_path": str(tmp_path / "lora"), "lora_rank": 2, "lora_alpha": 4})
    assert model.lora_config.r == 4 and model.lora_config.lora_alpha == 8  # the adapter's own
    msgs = [r.getMessage() for r in caplog.records]
    assert any("lora_rank=2" in m and "r=4" in m and "lora_alpha=4" in m and "lora_alpha=8" in m for m in msgs), msgs
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.peft.lora"):
        apply_lora(AutoModelForCausalLM.from_pretrained(base),
                   {"lora_path": str(tmp_path / "lora"), "lora_rank": 4, "lora_alpha": 8})
    assert not caplog.records  # matching keys: nothing to say


def test_merged_lora_on_a_tied_lm_head_reloads_equal(tmp_path):
    # lora_target_modules with lm_head on a tied model (SmolLM2 ties them): the merged model is saved untied with its
    # own lm_head.weight (saved tied, it would reload with the unmerged embedding as head: logits off by ~1.8)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=64)
    torch.manual_seed(0)
    model = apply_lora(LlamaForCausalLM(cfg), {"lora_rank": 2, "lora_target_modules": ["lm_head", "q_proj"]}).eval()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        want = model(ids)
        merge_lora(model)
        assert torch.allclose(model(ids), want, atol=1e-5)
    model.save_pretrained(str(tmp_path / "merged"))
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["tie_word_embeddings"] is False
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32).eval()(ids)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_merge_on_eval_leaves_a_tied_lm_head_embedding_alone():
    # merge_on_eval folds adapters in place on eval(), but not one on an lm_head tied to embed_tokens (the input
    # embedding would change too: logits off by ~10)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=64)
    torch.manual_seed(0)
    model = apply_lora(LlamaForCausalLM(cfg), LoRAConfig(r=2, target_modules=["lm_head", "q_proj"], merge_on_eval=True))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    emb = model.model.embed_tokens.weight.detach().clone()
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        want = model.train()(ids)
        got = model.eval()(ids)  # merges q_proj in place; lm_head stays unmerged
    assert torch.equal(model.model.embed_tokens.weight, emb)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert model.model.layers[0].self_attn.q_proj.merged and not model.lm_head.merged


def test_adapter_whose_base_moved_names_adapter_config_and_the_fixes(tmp_path):
    # predict.py --model_name_or_path <adapter dir> and merge_lora_params.py: the error names adapter_config.json,
    # the key holding the missing path and the flag that gives another base
    base = make_tiny_model_dir(str(tmp_path / "base"))
    save_lora(apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2}), str(tmp_path / "adapter"),
              base_model_name_or_path=base)
    shutil.move(base, tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json: the adapter's base model .*base' "
                                                r"\(base_model_name_or_path\) is not a local directory.*"
                                                r"--model_name_or_path <base dir>"):
        load_merged_lora(str(tmp_path / "adapter"), base)
    model, _ = load_merged_lora(str(tmp_path / "adapter"), str(tmp_path / "moved"))  # the explicit base works
    assert model is not None
