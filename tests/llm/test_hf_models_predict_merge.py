"""predict.py and merge_lora_params.py on a transformers family (Qwen2): greedy reply equals transformers'
generate, and a merged adapter equals base + adapter applied by peft."""

import json

import torch

from tests._hf_tiny import save_tiny_model_dir
from tests._scripts import load_script


def test_predict_reply_equals_transformers_generate(tmp_path, capsys):
    import transformers

    model_dir = save_tiny_model_dir("qwen2", tmp_path / "m")
    predict = load_script("llm/predict.py", "llm_predict_hf")
    model, tok = predict.load_model_and_tokenizer(model_dir, "float32")
    assert type(model).__name__ == "HFCausalLM"
    ids = torch.tensor([tok.encode("hello there", add_special_tokens=False)])
    ours = predict.generate(model, ids, 6, eos_token_id=None)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ref = hf.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=6)
    assert torch.equal(ours, ref)


def test_merge_lora_params_on_a_transformers_family(tmp_path):
    import peft
    import transformers

    from paddlenlp_ext.peft import apply_lora, save_lora
    from paddlenlp_ext.peft.lora import LoRAConfig
    from paddlenlp_ext.transformers import AutoModelForCausalLM

    base = save_tiny_model_dir("qwen2", tmp_path / "base")
    model = apply_lora(AutoModelForCausalLM.from_pretrained(base), LoRAConfig(r=4, lora_alpha=8))
    torch.manual_seed(1)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.05)
    save_lora(model, str(tmp_path / "adapter"), base_model_name_or_path=base)
    merge = load_script("llm/merge_lora_params.py", "llm_merge_hf")
    assert merge.main(["--lora_path", str(tmp_path / "adapter"), "--output_path", str(tmp_path / "merged")]) == 0
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["model_type"] == "qwen2"
    ids = torch.randint(3, 1000, (1, 9))
    ref = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), str(tmp_path / "adapter"))
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, ref.eval()(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
