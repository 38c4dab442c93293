"""``llm/tools/preprocess/create_pretraining_data.py``: tokens equal the tokenizer's (no special tokens, eos
appended), both formats, parallel workers, and a failed run writes nothing."""

from __future__ import annotations

import json
import os

import pytest

from paddlenlp_ext.datasets.pretraining import IndexedTokens
from tests._scripts import load_script

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TEXTS = ["The cat sat on the mat. It was warm!", "", "Numbers 12345 and more text.\nA second line here.",
         "Loooooooong vowel."]


@pytest.fixture(scope="module")
def tool():
    return load_script("llm/tools/preprocess/create_pretraining_data.py")


@pytest.fixture(scope="module")
def tok():
    from paddlenlp_ext.transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOL)


def _jsonl(path, texts, key="text"):
    path.write_text("".join(json.dumps({key: t}) + "\n" for t in texts))
    return str(path)


def test_tokens_match_the_tokenizer_in_both_formats(tool, tok, tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", TEXTS)
    out = tool.main(["--model_name_or_path", SMOL, "--input_path", src, "--output_prefix", str(tmp_path / "c"),
                     "--append_eos", "--max_repeated_len", "3", "--workers", "2"])
    assert out["documents"] == 3 and out["dtype"] == "uint16"  # the empty document is skipped
    c = IndexedTokens(str(tmp_path / "c"))
    want = [tok.encode(t.strip(), add_special_tokens=False) + [tok.eos_token_id]
            for t in (TEXTS[0], TEXTS[2], "Lo" + "ng vowel.")]
    assert [c.get(i).tolist() for i in range(len(c))] == want
    assert c.meta["vocab_size"] == len(tok) and c.meta["eos_token_id"] == tok.eos_token_id
    tool.main(["--model_name_or_path", SMOL, "--input_path", str(tmp_path), "--output_prefix", str(tmp_path / "n"),
               "--append_eos", "--max_repeated_len", "3", "--data_impl", "npy", "--split_sentences"])
    n = IndexedTokens(str(tmp_path / "n"))
    assert n.format == "npy" and len(n) > 3 and n.doc_idx.tolist()[-1] == len(n) and len(n.doc_idx) == 4
    assert [t for i in range(len(n)) for t in n.get(i).tolist()][-1] == tok.eos_token_id


def test_bad_line_names_file_and_line_and_writes_nothing(tool, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "fine"}) + "\n" + "{not json\n")
    with pytest.raises(ValueError, match=r"in\.jsonl:2: not JSON"):
        tool.main(["--model_name_or_path", SMOL, "--input_path", str(src), "--output_prefix", str(tmp_path / "c")])
    with pytest.raises(ValueError, match=r"in\.jsonl:1: no 'body' key"):
        tool.main(["--model_name_or_path", SMOL, "--input_path", str(src), "--output_prefix", str(tmp_path / "c"),
                   "--json_key", "body"])
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]
