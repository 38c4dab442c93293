"""llm/run_finetune.py on tiny random ``transformers`` families (Qwen2 with sliding layers, Qwen3, Mistral, Gemma 3,
Phi-3, Llama through transformers): packed SFT lowers the dev loss, the model reloads in ``transformers`` to the
same logits, LoRA adapters load with ``peft.PeftModel``, and bad input gets one clear error."""

import json

import pytest
import torch

from tests._hf_tiny import save_tiny_model_dir
from trainer_fixtures import load_run_finetune, write_sft_config

_SETTINGS = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "per_device_eval_batch_size": 2,
             "max_steps": 3, "learning_rate": 5e-3, "warmup_steps": 0, "logging_steps": 1, "save_strategy": "no",
             "max_length": 96, "src_length": 48, "flash_mask": True, "do_train": True, "do_eval": True,
             "disable_tqdm": True, "chat_max_new_tokens": 3, "report_to": []}


def _job(tmp_path, make_tiny_sft_job, family, **overrides):
    root = make_tiny_sft_job(tmp_path, n_train=6, n_dev=2)
    import shutil

    shutil.rmtree(root / "model")
    save_tiny_model_dir(family, root / "model", **overrides)
    return root


def _same_logits_in_transformers(out, ids):
    import transformers

    from paddlenlp_ext.transformers import AutoModelForCausalLM

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    return ours


@pytest.mark.parametrize("family", ["qwen2", "gemma3_text", "phi3"])
def test_sft_on_packs_trains_and_reloads_in_transformers(tmp_path, make_tiny_sft_job, family, capsys):
    root = _job(tmp_path, make_tiny_sft_job, family)
    out = tmp_path / "out"
    summary = load_run_finetune().main(write_sft_config(root, out, _SETTINGS))
    assert summary["global_step"] == 3 and summary["dev_loss_after"] < summary["dev_loss_before"]
    assert "[chat] assistant:" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family and "FlashMask" not in json.dumps(config)
    model = _same_logits_in_transformers(out, torch.randint(3, 1000, (1, 10)))
    assert type(model).__name__ == "HFCausalLM"


def test_llama_through_transformers_equals_native(tmp_path, make_tiny_sft_job):
    """model_implementation: transformers runs the same Llama checkpoint to the same losses as the native model."""
    root = make_tiny_sft_job(tmp_path, n_train=6, n_dev=2)
    mod = load_run_finetune()
    s = dict(_SETTINGS, chat_after_train=False, use_fused_linear_cross_entropy=False)
    native = mod.main(write_sft_config(root, tmp_path / "native", s))
    hf = mod.main(write_sft_config(root, tmp_path / "hf", s, model_implementation="transformers"))
    assert hf["dev_loss_before"] == pytest.approx(native["dev_loss_before"], rel=1e-5)
    assert hf["dev_loss_after"] == pytest.approx(native["dev_loss_after"], rel=1e-4)


def test_fused_linear_cross_entropy_equals_the_logits_loss(tmp_path, make_tiny_sft_job):
    root = _job(tmp_path, make_tiny_sft_job, "qwen3")
    mod = load_run_finetune()
    s = dict(_SETTINGS, chat_after_train=False, max_steps=2)
    fused = mod.main(write_sft_config(root, tmp_path / "fused", s, use_fused_linear_cross_entropy=True))
    plain = mod.main(write_sft_config(root, tmp_path / "plain", s, use_fused_linear_cross_entropy=False))
    assert fused["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-5)
    assert fused["dev_loss_after"] == pytest.approx(plain["dev_loss_after"], rel=1e-5)


def test_lora_adapter_loads_with_peft(tmp_path, make_tiny_sft_job):
    import peft
    import transformers

    root = _job(tmp_path, make_tiny_sft_job, "mistral")
    out = tmp_path / "lora"
    load_run_finetune().main(write_sft_config(root, out, _SETTINGS, lora=True, lora_rank=4, chat_after_train=False,
                                              learning_rate=5e-2, merge_weights=True))
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= {
        t.replace(".*", "") for t in adapter["target_modules"]} | set(adapter["target_modules"])
    base = transformers.AutoModelForCausalLM.from_pretrained(str(root / "model"), dtype=torch.float32)
    with_adapter = peft.PeftModel.from_pretrained(base, str(out)).eval()
    ids = torch.randint(3, 1000, (1, 10))
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(out / "merged"), dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(with_adapter(input_ids=ids).logits, merged(input_ids=ids).logits, rtol=1e-4,
                                   atol=1e-4)


def test_recompute_keeps_the_loss(tmp_path, make_tiny_sft_job):
    root = _job(tmp_path, make_tiny_sft_job, "qwen2")
    mod = load_run_finetune()
    s = dict(_SETTINGS, chat_after_train=False, max_steps=2, do_eval=False)
    plain = mod.main(write_sft_config(root, tmp_path / "plain", s))
    rec = mod.main(write_sft_config(root, tmp_path / "rec", s, recompute=True))
    assert rec["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-5)


def test_fused_op_keys_train_a_transformers_model(tmp_path, make_tiny_sft_job):
    """use_fused_rms_norm / use_fused_rope / use_fused_swiglu route Qwen2's norms, RoPE and MLPs to the fused ops
    (on the CPU their eager math, which is transformers' own): the same losses as the run without them."""
    root = _job(tmp_path, make_tiny_sft_job, "qwen2")
    mod = load_run_finetune()
    s = dict(_SETTINGS, chat_after_train=False, max_steps=2)
    plain = mod.main(write_sft_config(root, tmp_path / "plain", s))
    fused = mod.main(write_sft_config(root, tmp_path / "fused", s, use_fused_rms_norm=True, use_fused_rope=True,
                                               use_fused_swiglu=True))
    assert fused["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-6)
    assert fused["dev_loss_after"] == pytest.approx(plain["dev_loss_after"], rel=1e-6)


def test_fused_rope_on_a_family_with_its_own_rope_function_is_refused(tmp_path, make_tiny_sft_job):
    root = _job(tmp_path, make_tiny_sft_job, "phi3")  # Phi-3's apply_rotary_pos_emb splits off a partial part
    with pytest.raises(ValueError, match=r"use_fused_rope: true needs attention that applies RoPE by transformers' "
                                         r"Llama apply_rotary_pos_emb; .*model_type 'phi3'"):
        load_run_finetune().main(write_sft_config(root, tmp_path / "o", _SETTINGS, use_fused_rope=True))


def test_remote_code_needs_trust_remote_code(tmp_path, make_tiny_sft_job):
    root = _job(tmp_path, make_tiny_sft_job, "qwen2")
    cfg_file = root / "model" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.update(model_type="my_qwen", auto_map={"AutoModelForCausalLM": "modeling_my_qwen.MyQwenForCausalLM"})
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json: model_type 'my_qwen' is defined by Python code .* "
                                         r"trust_remote_code: true"):
        load_run_finetune().main(write_sft_config(root, tmp_path / "o", _SETTINGS))


def test_unexpressible_attention_is_refused(tmp_path, make_tiny_sft_job):
    """Gemma 2's attention logit softcapping: refused before the weights load, naming the key and the way out."""
    root = _job(tmp_path, make_tiny_sft_job, "qwen2")
    cfg_file = root / "model" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.update(model_type="gemma2", architectures=["Gemma2ForCausalLM"], attn_logit_softcapping=50.0)
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json: attn_logit_softcapping=50.0 .*attn_implementation='sdpa'"):
        load_run_finetune().main(write_sft_config(root, tmp_path / "o", _SETTINGS))
