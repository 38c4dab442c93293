"""Bundled data: the build script is deterministic and reproduces the committed files byte for byte; the
committed files pass the SFT and preference readers."""

import importlib.util
import os
import subprocess
import sys

import pytest

from paddlenlp_ext.datasets import read_jsonl, sft_data_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")
FILES = ["sft/train.json", "sft/dev.json", "preference/train.jsonl", "preference/dev.jsonl"]


def test_build_reproduces_committed_files(tmp_path):
    if importlib.util.find_spec("chatterbot_corpus") is None:
        pytest.skip("chatterbot-corpus is not installed")
    from importlib.metadata import version

    if version("chatterbot-corpus") != "1.3.3":
        pytest.skip("the committed files were built from chatterbot-corpus 1.3.3")
    for out in (tmp_path / "a", tmp_path / "b"):
        subprocess.run([sys.executable, os.path.join(DATA, "build_data.py"), "--out", str(out)], check=True,
                       capture_output=True, timeout=120)
    for rel in FILES:
        built_a = (tmp_path / "a" / rel).read_bytes()
        assert built_a == (tmp_path / "b" / rel).read_bytes(), rel
        with open(os.path.join(DATA, rel), "rb") as f:
            assert built_a == f.read(), f"{rel} differs from a fresh build; rerun python data/build_data.py"


def test_committed_sft_files_read():
    files = sft_data_files(os.path.join(DATA, "sft"))
    assert set(files) == {"train", "dev"}
    train = read_jsonl(files["train"][0])
    assert len(train) == 808 and any(len(r["src"]) > 1 for r in train)


def test_committed_preference_files_are_constructed_pairs():
    rows = read_jsonl(os.path.join(DATA, "preference", "train.jsonl"), validate=None)
    assert len(rows) == 747
    for r in rows:
        assert len(r["src"]) == 1 and r["tgt"] == [] and len(r["response"]) == 2
        assert sorted(r["sort"]) == [0, 1] and r["construction"].startswith("mismatched-reply")
    firsts = sum(r["sort"][0] == 1 for r in rows)
    assert 0.4 < firsts / len(rows) < 0.6  # the chosen response is not always first
    pref = pytest.importorskip("paddlenlp_ext.datasets.preference")
    if hasattr(pref, "check_preference_data"):
        for i, r in enumerate(rows[:50]):
            ex = pref.check_preference_data(r, where=f"train.jsonl:{i + 1}")
            assert ex.chosen == r["response"][r["sort"].index(1)]
