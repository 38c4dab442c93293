"""Malformed SFT input gives errors naming file and line; PaddleNLP directory layout; DataArgument ->
datasets + collator end to end (stub tokenizer)."""

import json

import pytest
import torch

from paddlenlp_ext.datasets import (
    ZeroPaddingIterableDataset,
    ZeroPaddingMapDataset,
    create_sft_datasets,
    make_sft_collator,
    read_jsonl,
    resolve_chat_template,
    sft_data_files,
)
from paddlenlp_ext.trainer.arguments import DataArgument


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("line, problem", [
    ('{"src": "a", "tgt": "b"', r"bad\.json:2: invalid JSON at column"),
    ('{"src": "a"}', r"bad\.json:2: missing key\(s\) \['tgt'\]"),
    ('{"src": ["a", "b"], "tgt": ["x"]}', r"bad\.json:2: \"src\" has 2 turns but \"tgt\" has 1"),
    ('{"src": 3, "tgt": "x"}', r"bad\.json:2: \"src\" must be a string or a list of strings"),
    ('{"src": [], "tgt": []}', r"bad\.json:2: \"src\" is an empty list"),
    ('["a", "b"]', r"bad\.json:2: expected a JSON object"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, problem):
    path = write_lines(tmp_path / "bad.json", ['{"src": "q", "tgt": "a"}', line])
    with pytest.raises(ValueError, match=problem):
        read_jsonl(path)


def test_empty_file_and_blank_lines(tmp_path):
    with pytest.raises(ValueError, match=r"empty\.json: empty file"):
        read_jsonl(write_lines(tmp_path / "empty.json", ["", "  "]))
    rows = read_jsonl(write_lines(tmp_path / "ok.json", ['{"src": "q", "tgt": "a", "extra": 1}', "",
                                                         '{"src": ["q1", "q2"], "tgt": ["a1", "a2"]}']))
    assert rows[0] == {"src": ["q"], "tgt": ["a"], "extra": 1} and len(rows) == 2
    with pytest.raises(FileNotFoundError):
        read_jsonl(str(tmp_path / "missing.json"))


def test_directory_layouts(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    write_lines(flat / "train.json", ['{"src": "q", "tgt": "a"}'])
    write_lines(flat / "dev.json", ['{"src": "q", "tgt": "a"}'])
    assert sft_data_files(str(flat)) == {"train": [str(flat / "train.json")], "dev": [str(flat / "dev.json")]}
    nested = tmp_path / "nested"
    (nested / "train").mkdir(parents=True)
    for name in ("b.json", "a.json"):
        write_lines(nested / "train" / name, ['{"src": "q", "tgt": "a"}'])
    assert sft_data_files(str(nested)) == {"train": [str(nested / "train" / "a.json"),
                                                     str(nested / "train" / "b.json")]}
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match="no data found"):
        sft_data_files(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="neither a directory nor a file"):
        sft_data_files(str(tmp_path / "nope"))


def _data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    words = "a b c d e f g h i j k".split()
    rows = [{"src": " ".join(words[: 1 + i % 5]), "tgt": " ".join(words[i % 3: i % 3 + 2])} for i in range(40)]
    rows.append({"src": ["a b", "c"], "tgt": ["x", "y z"]})
    write_lines(d / "train.json", [json.dumps(r) for r in rows])
    write_lines(d / "dev.json", [json.dumps(r) for r in rows[:6]])
    return str(d)


@pytest.mark.parametrize("lazy, greedy", [(False, False), (False, True), (True, True)])
def test_create_sft_datasets_packed(tmp_path, stub_tok, lazy, greedy):
    args = DataArgument(dataset_name_or_path=_data_dir(tmp_path), zero_padding=True, greedy_zero_padding=greedy,
                        lazy=lazy, max_length=16, src_length=8)
    ds = create_sft_datasets(args, stub_tok)
    assert isinstance(ds["train"], ZeroPaddingIterableDataset if lazy else ZeroPaddingMapDataset)
    assert isinstance(ds["dev"], ZeroPaddingMapDataset)
    packs = list(ds["train"])
    assert sum(len(p["seq_lens"]) for p in packs) == 41  # every example placed exactly once
    assert all(sum(p["seq_lens"]) <= 16 for p in packs) and len(packs) < 41
    batch = make_sft_collator(args, stub_tok)(packs[:3])
    assert batch["input_ids"].shape == (3, 16) and batch["attn_mask_startend_row_indices"].shape == (3, 1, 16, 1)
    # padding after each pack's tokens: the tokenizer's pad id, label -100, startend 0
    for b, p in enumerate(packs[:3]):
        n = sum(p["seq_lens"])
        assert batch["input_ids"][b, n:].eq(stub_tok.pad_token_id).all() and batch["labels"][b, n:].eq(-100).all()
        assert batch["attn_mask_startend_row_indices"][b, 0, n:, 0].eq(0).all()
        assert batch["input_ids"][b, :n].tolist() == p["input_ids"]


def test_create_sft_datasets_unpacked_dynamic_padding(tmp_path, stub_tok):
    args = DataArgument(dataset_name_or_path=_data_dir(tmp_path), zero_padding=False, max_length=16, src_length=8,
                        pad_to_multiple_of=4)
    ds = create_sft_datasets(args, stub_tok)
    assert len(ds["train"]) == 41 and all(len(p["seq_lens"]) == 1 for p in ds["train"].packs)
    batch = make_sft_collator(args, stub_tok)([ds["train"][0], ds["train"][1]])
    assert batch["input_ids"].shape[1] % 4 == 0 and batch["input_ids"].shape[1] <= 16
    assert batch["input_ids"].dtype == torch.int64


def test_resolve_chat_template(tmp_path):
    assert resolve_chat_template(None) == "auto" and resolve_chat_template("none") is None
    j = tmp_path / "tpl.jinja"
    j.write_text("{{ messages }}")
    assert resolve_chat_template(str(j)) == "{{ messages }}"
    d = tmp_path / "dir"
    d.mkdir()
    (d / "chat_template.json").write_text(json.dumps({"chat_template": "T"}))
    assert resolve_chat_template(str(d)) == "T"
    (d / "chat_template.json").write_text(json.dumps({"system": "", "conversation": ["{{user}}", "{{bot}}"]}))
    with pytest.raises(ValueError, match="PaddleNLP ChatTemplate JSON"):
        resolve_chat_template(str(d))
    with pytest.raises(ValueError, match="no such file"):
        resolve_chat_template(str(tmp_path / "missing.jinja"))


def test_invalid_json_column_is_on_the_line(tmp_path):
    """The column of an error at the end of a line was reported as column 1 (json.loads got the line with its
    newline, so the error sat on the empty second line; new-user pass, session 13)."""
    bad = '{"src": "q", "tgt": "a",'
    path = write_lines(tmp_path / "bad.json", ['{"src": "q", "tgt": "a"}', bad])
    with pytest.raises(ValueError, match=rf"bad\.json:2: invalid JSON at column {len(bad) + 1}: Expecting property"):
        read_jsonl(path)


def test_several_pretty_printed_objects_say_it_is_not_jsonl(tmp_path):
    """Records written one after another with json.dumps(r, indent=2) got no hint (only a whole-file object or
    array did); new-user pass, session 13."""
    path = tmp_path / "train.json"
    path.write_text("".join(json.dumps({"src": f"q{i}", "tgt": "a"}, indent=2) + "\n" for i in range(3)))
    with pytest.raises(ValueError, match=r"train\.json:1: invalid JSON .*holds 3 JSON objects, each spread over "
                                         r"several lines .*jq -c \."):
        read_jsonl(str(path))
    path.write_text('{"src": "q",\n "tgt": "a"}\n[1]\n')  # not only objects: no claim about the file
    with pytest.raises(ValueError) as e:
        read_jsonl(str(path))
    assert "JSON objects" not in str(e.value)
