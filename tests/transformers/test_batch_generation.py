"""Llama decodes a left-padded batch with its KV cache (FlashMask vectors over the cached keys): the same tokens as
each prompt alone, and as the same batch without the cache."""

import pytest
import torch

from paddlenlp_ext.transformers import LlamaConfig, LlamaForCausalLM
from paddlenlp_ext.transformers.batch_generation import generate_batch
from paddlenlp_ext.transformers.generation import generate


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


PROMPTS = [[3, 4, 5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23]]


def test_llama_left_padded_batch_with_cache_equals_one_prompt_at_a_time(model, monkeypatch):
    alone = [generate(model, torch.tensor([p]), 8)[0, len(p):].tolist() for p in PROMPTS]
    caches = []
    make = model.make_kv_cache
    monkeypatch.setattr(model, "make_kv_cache", lambda *a: caches.append(make(*a)) or caches[-1])
    assert generate_batch(model, PROMPTS, 8, pad_token_id=0) == alone
    assert caches, "the padded batch decoded without the KV cache"
    assert generate_batch(model, PROMPTS, 8, pad_token_id=0, use_cache=False) == alone


def test_llama_mask_over_cached_keys_is_checked(model):
    cache = model.make_kv_cache(1, 8)
    model(torch.tensor([[1, 2, 3]]), kv_cache=cache)
    with pytest.raises(ValueError, match=r"keys = cached \+ seq = 4"):
        model(torch.tensor([[4]]), attn_mask_startend_row_indices=torch.zeros(1, 1, 3, 2, dtype=torch.int32),
              kv_cache=cache)
