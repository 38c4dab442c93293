"""ERNIE-3.5-SE's SentencePiece BPE tokenizer: SentencePiece's own ids, PaddleNLP's conventions, save/reload,
loading in plain transformers, the bundled model's build, and the errors for a bad directory or vocabulary."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import sentencepiece as spm
import torch
import transformers

from paddlenlp_ext.transformers import AutoTokenizer
from paddlenlp_ext.transformers.ernie35 import BUNDLED_TOKENIZER_DIR, Ernie35Config, Ernie35Tokenizer
from paddlenlp_ext.transformers.ernie35.tokenizer import SPM_FILE
from paddlenlp_ext.transformers.vocab_check import check_tokenizer_fits_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = ("The Broncos took an early lead in Super Bowl 50 and never trailed.  Two  spaces, digits 2024, "
        "café, 你好, a tab\there\nand a new line. ")


@pytest.fixture(scope="module")
def sp():
    return spm.SentencePieceProcessor(model_file=os.path.join(BUNDLED_TOKENIZER_DIR, SPM_FILE))


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained("ernie/tiny-random-ernie")


def test_ids_and_round_trip_match_sentencepiece(sp, tok):
    assert isinstance(tok, Ernie35Tokenizer) and len(tok) == sp.get_piece_size() == 4096
    for text in (TEXT, "", " leading space", "Hello world!"):
        ids = tok(text)["input_ids"]
        assert ids == [sp.bos_id()] + sp.encode(text)
        assert tok.decode(ids, skip_special_tokens=True) == sp.decode(sp.encode(text)) == text
    assert tok.convert_ids_to_tokens(tok("Hello world")["input_ids"]) == ["<s>"] + sp.encode("Hello world",
                                                                                             out_type=str)


def test_paddlenlp_conventions(tok):
    assert (tok.unk_token, tok.bos_token, tok.eos_token) == ("<unk>", "<s>", "</s>")
    assert tok.pad_token == tok.unk_token and tok.pad_token_id == 0  # PaddleNLP: pad = unk
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    ids = tok("a b")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] != tok.eos_token_id  # add_bos_token true, add_eos_token false
    assert tok.padding_side == "left" and tok.model_max_length == 2048
    batch = tok(["Hi", "Hello there, friend"], padding=True)
    short = batch["input_ids"][0]
    assert short[0] == tok.pad_token_id and short[-len(tok("Hi")["input_ids"]):] == tok("Hi")["input_ids"]
    assert batch["attention_mask"][0][0] == 0 and batch["attention_mask"][1] == [1] * len(batch["input_ids"][1])
    assert tok.chat_template is None


def test_save_reload_and_plain_transformers(tmp_path, tok):
    tok.save_pretrained(tmp_path / "saved")
    files = set(os.listdir(tmp_path / "saved"))
    assert {SPM_FILE, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= files
    again = AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    plain = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "saved"))  # no code of ours
    for t in (again, plain):
        assert t(TEXT)["input_ids"] == tok(TEXT)["input_ids"]
        assert t.decode(t(TEXT)["input_ids"], skip_special_tokens=True) == TEXT
        assert (t.pad_token, t.padding_side) == ("<unk>", "left")
    # saved again from the reloaded tokenizer: the SentencePiece model travels on (PaddleNLP reads it)
    again.save_pretrained(tmp_path / "twice")
    assert (tmp_path / "twice" / SPM_FILE).read_bytes() == (tmp_path / "saved" / SPM_FILE).read_bytes()


def test_loads_paddlenlp_tokenizer_directory(tmp_path, tok):
    pd = tmp_path / "ernie-tokenizer"
    shutil.copytree(BUNDLED_TOKENIZER_DIR, pd)
    assert sorted(os.listdir(pd)) == [SPM_FILE, "special_tokens_map.json", "tokenizer_config.json"]
    assert json.loads((pd / "tokenizer_config.json").read_text())["tokenizer_class"] == "Ernie35Tokenizer"
    loaded = AutoTokenizer.from_pretrained(str(pd))
    assert loaded(TEXT)["input_ids"] == tok(TEXT)["input_ids"]
    cfg = json.loads((pd / "tokenizer_config.json").read_text())
    cfg["add_eos_token"] = True  # the directory's config is honoured
    (pd / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert AutoTokenizer.from_pretrained(str(pd))("a")["input_ids"][-1] == 2


def test_directory_without_the_model_file(tmp_path):
    pd = tmp_path / "ernie-tokenizer"
    shutil.copytree(BUNDLED_TOKENIZER_DIR, pd)
    os.remove(pd / SPM_FILE)
    with pytest.raises(FileNotFoundError, match=f"no {SPM_FILE}.*special_tokens_map.json"):
        AutoTokenizer.from_pretrained(str(pd))


def test_vocabulary_larger_than_the_model_is_refused(tok):
    small = Ernie35Config.from_pretrained("ernie/tiny-random-ernie", vocab_size=1000)
    with pytest.raises(ValueError, match="4096 tokens but ckpt has vocab_size=1000"):
        check_tokenizer_fits_model(tok, small, "ckpt")
    check_tokenizer_fits_model(tok, Ernie35Config.from_pretrained("ernie/tiny-random-ernie"), "preset")  # 32000


def test_vocabulary_mismatch_stops_the_launcher(tmp_path, capsys):
    from paddlenlp_ext.transformers.ernie35 import Ernie35ForCausalLM

    torch.manual_seed(0)
    cfg = Ernie35Config.from_pretrained("ernie/tiny-random-ernie", vocab_size=512, hidden_size=32,
                                        intermediate_size=48, num_attention_heads=4)
    Ernie35ForCausalLM(cfg).save_pretrained(str(tmp_path / "model"))
    for name in os.listdir(BUNDLED_TOKENIZER_DIR):
        shutil.copy(os.path.join(BUNDLED_TOKENIZER_DIR, name), tmp_path / "model")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "llm", "run_finetune.py"),
                           os.path.join(ROOT, "config", "ernie35se", "sft.json"), "--model_name_or_path",
                           str(tmp_path / "model"), "--output_dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "ops"), ROOT])})
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "4096 tokens" in errors[0] and "vocab_size=512" in errors[0], proc.stderr[-2000:]


def test_build_script_reproduces_the_bundled_model(tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "data", "build_ernie_tokenizer.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=120)
    for name in os.listdir(BUNDLED_TOKENIZER_DIR):
        assert (tmp_path / name).read_bytes() == open(os.path.join(BUNDLED_TOKENIZER_DIR, name), "rb").read(), name
    assert os.path.getsize(tmp_path / SPM_FILE) < 1_000_000
