"""A preference file given to SFT (or an SFT file given to DPO/RM) names what it looks like and the launcher to
use; before, SFT said only '"tgt" is an empty list' and DPO 'missing key response'."""

import json

import pytest

from paddlenlp_ext.datasets.jsonl import read_jsonl
from paddlenlp_ext.datasets.preference import read_preference_jsonl


def test_preference_file_given_to_sft(tmp_path):
    p = tmp_path / "train.json"
    p.write_text(json.dumps({"src": ["q"], "tgt": [], "response": ["a", "b"], "sort": [1, 0]}) + "\n")
    with pytest.raises(ValueError, match=r"train\.json:1: .*preference record .*run_dpo\.py or llm/run_reward\.py"):
        read_jsonl(str(p))


def test_sft_file_given_to_dpo(tmp_path):
    p = tmp_path / "train.jsonl"
    p.write_text(json.dumps({"src": "q", "tgt": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"train\.jsonl:1: missing key 'response'.*SFT record.*run_finetune\.py"):
        list(read_preference_jsonl(str(p)))
