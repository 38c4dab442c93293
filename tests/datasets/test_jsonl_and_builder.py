"""PaddleNLP's SFT directory layouts; chat template files; DataArgument ->
datasets + collator end to end (stub tokenizer)."""

import json
import logging
import os

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


@pytest.mark.parametrize("kind", ["json", "jinja"])
def test_chat_template_file_with_a_utf8_bom_reads_as_without(tmp_path, kind):
    # a BOM kept in the template would render U+FEFF before every conversation, and a tokenizer_config-style JSON
    # file with a BOM would fail json.loads and be taken whole as Jinja text
    jinja = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    text = json.dumps({"chat_template": jinja}) if kind == "json" else jinja
    path = tmp_path / f"template.{kind}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert resolve_chat_template(str(path)) == jinja


def test_chat_template_dir_of_a_trained_output_dir_reads_its_jinja_file(tmp_path):
    # every output_dir holds chat_template.jinja (transformers 5): chat_template: <that dir> reads it, and PaddleNLP's
    # chat_template.json
    jinja = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (tmp_path / "chat_template.jinja").write_text(jinja)
    assert resolve_chat_template(str(tmp_path)) == jinja
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="neither chat_template.jinja nor chat_template.json"):
        resolve_chat_template(str(empty))
    (empty / "chat_template.json").write_text(json.dumps({"chat_template": jinja}))  # PaddleNLP's name still read
    assert resolve_chat_template(str(empty)) == jinja


def test_sft_split_dir_with_jsonl_parts_warns_and_a_jsonl_only_dir_names_the_rename(tmp_path, caplog):
    # PaddleNLP's layout reads *.json only: <dir>/train/part-1.jsonl next to part-0.json is skipped with a warning,
    # and a dir holding only train.jsonl / dev.jsonl (the preference data's names) gets "no data found" naming them
    row = json.dumps({"src": "a", "tgt": "b"}) + "\n"
    (tmp_path / "d" / "train").mkdir(parents=True)
    (tmp_path / "d" / "train" / "part-0.json").write_text(row)
    (tmp_path / "d" / "train" / "part-1.jsonl").write_text(row)
    with caplog.at_level(logging.WARNING):
        files = sft_data_files(str(tmp_path / "d"))
    assert [os.path.basename(f) for f in files["train"]] == ["part-0.json"]
    assert "1 file(s) ignored (part-1.jsonl)" in caplog.text and "rename them to .json" in caplog.text
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "train.jsonl").write_text(row)
    with pytest.raises(ValueError, match=r"no data found.*found train\.jsonl: the files must be named \.json"):
        sft_data_files(str(tmp_path / "e"))


def test_sft_data_dir_mixing_the_two_layouts_is_one_clear_error(tmp_path):
    """``<dir>/dev.json`` beside ``<dir>/train/*.json``: the flat layout wins as soon as dev.json exists (PaddleNLP's
    rule), so the train files would be ignored; ``sft_data_files`` names the mix and the fix instead of "no train
    split" about a directory that has train/*.json."""
    row = json.dumps({"src": "a", "tgt": "b"}) + "\n"
    (tmp_path / "d" / "train").mkdir(parents=True)
    (tmp_path / "d" / "train" / "part-0.json").write_text(row)
    (tmp_path / "d" / "dev.json").write_text(row)
    with pytest.raises(ValueError, match=r"mixes the two data layouts, dev\.json beside train/\*\.json: .*"
                                         r"concatenate train/\*\.json into train\.json"):
        sft_data_files(str(tmp_path / "d"))
    (tmp_path / "d" / "train.json").write_text(row)  # both flat files: the flat layout, train/ is ignored
    assert sft_data_files(str(tmp_path / "d")) == {"train": [str(tmp_path / "d" / "train.json")],
                                                   "dev": [str(tmp_path / "d" / "dev.json")]}
