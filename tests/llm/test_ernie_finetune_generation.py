"""finetune_generation.py's flags on run_finetune.py: the ERNIE-3.5-SE article's SFT and LoRA commands as configs,
``tgt_length``, ``dataset_path``, instruction records, ``task_name squad`` from a local SQuAD v1.1 file."""

import json
import os
import shutil

import pytest
import torch

from paddlenlp_ext.datasets.jsonl import check_sft_record
from paddlenlp_ext.datasets.task_data import prepare_task_data, squad_records
from paddlenlp_ext.trainer.arguments import DataArgument
from tests._scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "config", "ernie35se", "finetune_generation")

SQUAD = {"version": "1.1", "data": [
    {"title": "Super_Bowl_50", "paragraphs": [
        {"context": "Super Bowl 50 was an American football game.",
         "qas": [{"id": "1", "question": "What was Super Bowl 50?",
                  "answers": [{"answer_start": 14, "text": "an American football game"},
                              {"answer_start": 17, "text": "American football game"}]},
                 {"id": "2", "question": "Which game?", "answers": []}]}]},
    {"title": "Paris", "paragraphs": [
        {"context": "Paris is the capital of France.",
         "qas": [{"id": "3", "question": "What is the capital of France?",
                  "answers": [{"answer_start": 0, "text": "Paris"}]},
                 {"id": "4", "question": "Paris is the capital of which country?",
                  "answers": [{"answer_start": 24, "text": "France"}]}]}]}]}

# written by hand from PaddleNLP's convert_example template: "answer: {a} context: {c}" -> "question: {q}"
EXPECTED = [
    {"src": "answer: an American football game context: Super Bowl 50 was an American football game.",
     "tgt": "question: What was Super Bowl 50?"},
    {"src": "answer: Paris context: Paris is the capital of France.", "tgt": "question: What is the capital of France?"},
    {"src": "answer: France context: Paris is the capital of France.",
     "tgt": "question: Paris is the capital of which country?"},
]


def _squad_dir(path):
    path.mkdir(parents=True, exist_ok=True)
    (path / "train-v1.1.json").write_text(json.dumps(SQUAD))
    (path / "dev-v1.1.json").write_text(json.dumps(SQUAD))
    return path


def test_squad_conversion_matches_the_template(tmp_path):
    assert squad_records(str(_squad_dir(tmp_path / "squad") / "train-v1.1.json")) == EXPECTED
    out = prepare_task_data("squad", None, str(tmp_path / "squad"), str(tmp_path / "conv"))
    rows = [json.loads(line) for line in (tmp_path / "conv" / "train.json").read_text().splitlines()]
    assert out == str(tmp_path / "conv") and rows == EXPECTED and (tmp_path / "conv" / "dev.json").exists()
    assert prepare_task_data(None, None, "anything", str(tmp_path / "x")) is None


def test_squad_without_a_local_copy_says_nothing_is_downloaded(tmp_path):
    for path in (None, str(tmp_path)):
        with pytest.raises(ValueError, match="downloads nothing.*train-v1.1.json.*--dataset_path"):
            prepare_task_data("squad", None, path, str(tmp_path / "conv"))
    with pytest.raises(ValueError, match="task_name='cnn_dm'.*no such built-in dataset.*nothing is downloaded"):
        prepare_task_data("cnn_dm", None, str(tmp_path), str(tmp_path / "conv"))
    with pytest.raises(ValueError, match="data_name needs task_name"):
        prepare_task_data(None, "squad", str(tmp_path), str(tmp_path / "conv"))


def test_instruction_records_become_src_tgt():
    assert check_sft_record({"instruction": "Translate to French.", "input": "cat", "output": "chat"}) == \
        {"src": ["Translate to French.\ncat"], "tgt": ["chat"]}
    assert check_sft_record({"instruction": "Say hi.", "input": "", "output": "hi"}) == {"src": ["Say hi."],
                                                                                        "tgt": ["hi"]}
    with pytest.raises(ValueError, match='"output" must be a string'):
        check_sft_record({"instruction": "x", "output": ["a"]})


def test_tgt_length_sets_max_length_and_dataset_path_aliases():
    assert DataArgument(src_length=1024, tgt_length=1024).max_length == 2048
    assert DataArgument(src_length=100, tgt_length=20).max_length == 120
    assert DataArgument(src_length=100).max_length == 2048  # PaddleNLP's run_finetune default
    assert DataArgument(src_length=100, tgt_length=20, max_length=300).max_length == 300
    assert DataArgument(dataset_path="d").dataset_name_or_path == "d"
    with pytest.raises(ValueError, match="tgt_length must be >= 1"):
        DataArgument(tgt_length=0)
    with pytest.raises(ValueError, match="give one of them"):
        DataArgument(dataset_path="a", dataset_name_or_path="b")


@pytest.mark.parametrize("name", ["sft.json", "lora.json"])
def test_article_commands_parse(name):
    model_args, data_args, training_args, _ = load_script("llm/run_finetune.py").parse_args(
        [os.path.join(CONFIGS, name)])
    assert (data_args.task_name, data_args.src_length, data_args.max_length) == ("squad", 1024, 2048)
    assert model_args.lora == (name == "lora.json") and training_args.num_train_epochs == 2
    assert training_args.load_best_model_at_end and training_args.recompute


@pytest.fixture(scope="module")
def tiny_ernie(tmp_path_factory):
    """A tiny random ERNIE-3.5-SE directory with the bundled ERNIE tokenizer (PaddleNLP's layout)."""
    from paddlenlp_ext.transformers.ernie35 import BUNDLED_TOKENIZER_DIR, Ernie35Config, Ernie35ForCausalLM

    path = tmp_path_factory.mktemp("tiny_ernie")
    torch.manual_seed(0)
    cfg = Ernie35Config.from_pretrained("ernie/tiny-random-ernie", hidden_size=32, intermediate_size=48,
                                        num_attention_heads=4, vocab_size=4096, max_position_embeddings=512)
    Ernie35ForCausalLM(cfg).save_pretrained(str(path))
    for f in os.listdir(BUNDLED_TOKENIZER_DIR):
        shutil.copy(os.path.join(BUNDLED_TOKENIZER_DIR, f), path)
    return path


@pytest.mark.parametrize("name", ["sft.json", "lora.json"])
def test_article_commands_train_on_tiny_ernie(tmp_path, tiny_ernie, name):
    out = tmp_path / "out"
    summary = load_script("llm/run_finetune.py").main([
        os.path.join(CONFIGS, name), "--model_name_or_path", str(tiny_ernie),
        "--dataset_path", str(_squad_dir(tmp_path / "squad")), "--output_dir", str(out), "--max_steps", "2",
        "--src_length", "48", "--tgt_length", "16", "--bf16", "false", "--fp16_opt_level", "O1", "--sharding", "",
        "--sharding_parallel_degree", "-1", "--chat_after_train", "false", "--report_to", "none"])
    assert summary["global_step"] == 2 and summary["dev_loss_after"] > 0
    assert (out / "task_data" / "squad" / "train.json").exists()
    saved = out / "merged" if (out / "merged").exists() else out
    assert (out / "sentencepiece.bpe.model").exists() or (saved / "sentencepiece.bpe.model").exists()
