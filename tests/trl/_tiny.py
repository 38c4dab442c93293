"""A tiny random Llama + word-level Hugging Face tokenizer saved as a local HF directory (fast launcher tests)."""

import json
import os

import torch

WORDS = ("hello how are you fine thanks what is your name bot good bad yes no maybe sky blue red "
         "the cat dog sat on mat weather sunny rainy").split()
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tiny_model_dir(path: str, chat_template: bool = True) -> str:
    """Write config.json + model.safetensors (random, seed 0) + tokenizer files into ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM

    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<unk>", "system", "user", "assistant"]
    vocab = {w: i for i, w in enumerate(specials + list(WORDS))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="<|im_end|>" if chat_template
                                  else "</s>", pad_token="<pad>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if chat_template:
        tok.chat_template = CHATML
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, rope_theta=100.0,
                      bos_token_id=vocab["<s>"], eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_pairs(path: str, n: int, seed: int = 0) -> str:
    """``n`` preference rows: chosen answers use "good"/"fine" words, rejected "bad"/"no" (learnable)."""
    g = torch.Generator().manual_seed(seed)
    prompts = ["hello how are you", "what is your name", "is the sky blue", "weather sunny", "the cat sat"]
    with open(path, "w") as f:
        for i in range(n):
            p = prompts[int(torch.randint(len(prompts), (1,), generator=g))]
            good = "good fine thanks yes" if i % 2 else "fine good"
            bad = "bad no maybe" if i % 3 else "no bad"
            order = int(torch.randint(2, (1,), generator=g))
            resp, sort = ([good, bad], [1, 0]) if order else ([bad, good], [0, 1])
            f.write(json.dumps({"src": [p], "tgt": [], "response": resp, "sort": sort}) + "\n")
    return path
