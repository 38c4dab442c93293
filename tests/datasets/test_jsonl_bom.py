"""A jsonl file saved with a UTF-8 byte-order mark (Windows editors, Excel's "CSV UTF-8") reads like one without."""

import pytest

from paddlenlp_ext.datasets.jsonl import read_jsonl
from paddlenlp_ext.datasets.preference import read_preference_jsonl

SFT = '{"src": "hi", "tgt": "hello"}\n'
PREF = '{"src": ["q"], "tgt": [], "response": ["a", "b"], "sort": [1, 0]}\n'


def _preference(path):
    return [(e.src, e.tgt, e.chosen, e.rejected, e.sort_chosen) for e in read_preference_jsonl(path)]


@pytest.mark.parametrize("read,good", [(read_jsonl, SFT), (_preference, PREF)], ids=["sft", "preference"])
def test_leading_bom_is_skipped(tmp_path, read, good):
    plain, bom = tmp_path / "plain.json", tmp_path / "bom.json"
    plain.write_text(good * 2, encoding="utf-8")
    bom.write_text(good * 2, encoding="utf-8-sig")  # EF BB BF before line 1
    assert bom.read_bytes().startswith(b"\xef\xbb\xbf")
    assert read(str(bom)) == read(str(plain))


def test_bom_inside_the_file_is_still_an_error(tmp_path):
    p = tmp_path / "train.json"
    p.write_bytes(SFT.encode() + b"\xef\xbb\xbf" + SFT.encode())  # two files concatenated
    with pytest.raises(ValueError, match=r"train\.json:2: invalid JSON"):
        read_jsonl(str(p))
