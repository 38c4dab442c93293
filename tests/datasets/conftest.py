"""Fixtures of the data tests (tokenizers from _data_tokenizers.py)."""

import pytest

from _data_tokenizers import CHATML, make_stub_tokenizer


@pytest.fixture
def stub_tok():
    return make_stub_tokenizer()


@pytest.fixture
def stub_chat_tok():
    return make_stub_tokenizer(CHATML)

