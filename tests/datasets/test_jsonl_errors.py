"""Data-file mistakes give errors naming the file and line (SFT and preference jsonl)."""

import pytest

from paddlenlp_ext.datasets.jsonl import read_jsonl
from paddlenlp_ext.datasets.preference import read_preference_jsonl

SFT = '{"src": "hi", "tgt": "hello"}\n'
PREF = '{"src": ["q"], "tgt": [], "response": ["a", "b"], "sort": [1, 0]}\n'


@pytest.mark.parametrize("read,good", [(read_jsonl, SFT), (lambda p: list(read_preference_jsonl(p)), PREF)],
                         ids=["sft", "preference"])
def test_not_utf8_names_file_and_line(tmp_path, read, good):
    p = tmp_path / "train.json"
    p.write_bytes(good.encode() + b'{"src": "caf\xe9"}\n')  # Latin-1 byte on line 2
    with pytest.raises(ValueError, match=r"train\.json:2: not UTF-8 \(byte 0xe9"):
        read(str(p))


@pytest.mark.parametrize("read", [read_jsonl, lambda p: list(read_preference_jsonl(p))], ids=["sft", "preference"])
def test_directory_and_empty_file(tmp_path, read):
    with pytest.raises(FileNotFoundError, match="is a directory"):
        read(str(tmp_path))
    empty = tmp_path / "empty.json"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=r"empty\.json: empty file"):
        read(str(empty))
