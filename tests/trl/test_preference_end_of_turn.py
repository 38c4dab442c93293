"""Preference data (DPO / RM) with a chat template that ends the assistant turn with no special token.

SFT appends ``eos_token`` to such a turn (``tests/datasets/test_sft_end_of_turn.py``), and the raw encoding
(``chat_template: none``) ends each response with ``eos`` as PaddleNLP does; before this, the template path of
``encode_response`` learned ``answer\\n`` with no end token at all, so DPO's chosen response never taught the
policy to stop. Templates whose turn ends in a special token (ChatML's ``<|im_end|>``) are unchanged.
"""

from __future__ import annotations

import logging

import pytest

from paddlenlp_ext.datasets.preference import encode_response

PLAIN = ("{# preference test #}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture()
def tokenizer():
    from paddlenlp_ext.transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_plain_template_response_ends_with_eos(tokenizer, caplog):
    chatml = encode_response(tokenizer, ["Hi"], [], "Hello there", True)
    assert chatml[-1] == tokenizer.eos_token_id  # <|im_end|> ends the ChatML turn already
    tokenizer.chat_template = PLAIN
    with caplog.at_level(logging.WARNING):
        ids = encode_response(tokenizer, ["Hi"], [], "Hello there", True)
    assert ids[-1] == tokenizer.eos_token_id and ids.count(tokenizer.eos_token_id) == 1
    assert tokenizer.decode(ids[:-1]) == "Hello there\n"  # the rendered turn, then the appended end token
    assert "appending eos_token" in caplog.text


def test_raw_encoding_unchanged(tokenizer):
    ids = encode_response(tokenizer, ["Hi"], [], "Hello there", False)
    assert ids[-1] == tokenizer.eos_token_id and tokenizer.decode(ids[:-1]) == "Hello there"
