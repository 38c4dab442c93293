"""AutoTokenizer.from_pretrained (the launchers' tokenizer load) on a bad path: one ValueError naming the tokenizer
keys and the files needed. A model directory without tokenizer files used to surface transformers' "Couldn't
instantiate the backend tokenizer ... install sentencepiece or tiktoken", and a missing tokenizer_name_or_path was
reported as a bad model_name_or_path."""

import pytest

from paddlenlp_ext.transformers import AutoTokenizer


def test_missing_tokenizer_path_names_the_tokenizer_keys(tmp_path):
    with pytest.raises(ValueError, match=r"tokenizer .*no_such_dir.*tokenizer_name_or_path"):
        AutoTokenizer.from_pretrained(str(tmp_path / "no_such_dir"))


def test_directory_without_tokenizer_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model directory written without its tokenizer
    with pytest.raises(ValueError, match=r"no tokenizer files \(tokenizer\.json.*tokenizer_name_or_path"):
        AutoTokenizer.from_pretrained(str(tmp_path))
