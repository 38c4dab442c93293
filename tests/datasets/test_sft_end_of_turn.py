"""A chat template that ends the assistant turn with no special token (plain ``role content`` text) would train no
end-of-answer label at all, and the fine-tuned model would never learn to stop: each assistant turn gets
``eos_token`` appended to its learned tokens, with one warning per template."""

import logging

import pytest

from _data_tokenizers import CHATML, make_stub_tokenizer, smollm2_tokenizer
from paddlenlp_ext.datasets import sft
from paddlenlp_ext.datasets.sft import IGNORE_INDEX as IGN
from paddlenlp_ext.datasets.sft import tokenize_sft_example

PLAIN = ("{% for m in messages %}{{ m['role'] + ' ' + m['content'] + ' ' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ 'assistant ' }}{% endif %}")
LOGGER = "paddlenlp_ext.datasets.sft"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(sft, "_WARNED_TEMPLATES", set(), raising=False)


def toks(tok, ids):
    return [tok.convert_ids_to_tokens(i) if i != IGN else IGN for i in ids]


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and "chat template" in r.getMessage()]


def test_plain_template_learns_eos_after_every_assistant_turn(caplog):
    tok = make_stub_tokenizer(PLAIN)
    ex = {"src": ["a b", "c"], "tgt": ["x y", "z"]}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        r = tokenize_sft_example(ex, tok, 6, 64)
        tokenize_sft_example(ex, tok, 6, 64)  # same template again: no second warning
    assert toks(tok, r["input_ids"]) == ["user", "a", "b", "assistant", "x", "y", "</s>", "user", "c", "assistant",
                                         "z"]
    assert [t for t in toks(tok, r["labels"]) if t != IGN] == ["x", "y", "</s>", "z", "</s>"]
    assert toks(tok, r["labels"])[-1] == "</s>"  # the last position predicts EOS: the model learns to stop
    # labels stay the next input token wherever they are learned
    for t, lab in enumerate(r["labels"][:-1]):
        if lab != IGN:
            assert r["input_ids"][t + 1] == lab
    msgs = _warnings(caplog)
    assert len(msgs) == 1 and "appending eos_token '</s>'" in msgs[0] and "special token" in msgs[0]


def test_template_with_an_end_of_turn_token_is_unchanged(caplog):
    tok = make_stub_tokenizer(CHATML)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        r = tokenize_sft_example({"src": ["a"], "tgt": ["x"]}, tok, 6, 64)
    assert [t for t in toks(tok, r["labels"]) if t != IGN] == ["x", "<|im_end|>"]  # no extra </s>
    assert not _warnings(caplog)


def test_appended_eos_counts_toward_max_length():
    tok = make_stub_tokenizer(PLAIN)
    ex = {"src": ["a", "b"], "tgt": ["x", "y"]}  # each turn: user a assistant x </s> = 5 tokens
    both = tokenize_sft_example(ex, tok, 6, 10)
    assert len(both["input_ids"]) == 9
    newest = tokenize_sft_example(ex, tok, 6, 9)  # 10 tokens do not fit: the older turn is dropped
    assert toks(tok, newest["input_ids"]) == ["user", "b", "assistant", "y"]
    assert [t for t in toks(tok, newest["labels"]) if t != IGN] == ["y", "</s>"]


def test_no_eos_token_warns_that_the_model_will_not_learn_to_stop(caplog):
    tok = make_stub_tokenizer(PLAIN)
    tok.eos_token = None
    assert tok.eos_token_id is None
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        r = tokenize_sft_example({"src": ["a"], "tgt": ["x"]}, tok, 6, 64)
    assert [t for t in toks(tok, r["labels"]) if t != IGN] == ["x"]
    msgs = _warnings(caplog)
    assert len(msgs) == 1 and "will not learn to stop" in msgs[0] and "{{ eos_token }}" in msgs[0]


def test_smollm2_tokenizer_with_a_plain_text_template():
    """Real BPE tokenizer, a template written without special tokens: the turn's text (with its newline) then
    SmolLM2's eos (<|im_end|>) is learned."""
    tok = smollm2_tokenizer()
    tmpl = ("{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}Assistant: {% endif %}")
    r = tokenize_sft_example({"src": ["What is 2+2?"], "tgt": ["Four."]}, tok, 64, 128, chat_template=tmpl)
    learned = [lab for lab in r["labels"] if lab != IGN]
    assert learned[-1] == tok.eos_token_id
    assert tok.decode(learned[:-1]) == " Four.\n"  # BPE's " Four" straddles the answer start: it is learned
