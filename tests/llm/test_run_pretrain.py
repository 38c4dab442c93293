"""``llm/run_pretrain.py``: PaddleNLP's schedules and sample counts, the job end to end (document masks, validation
perplexity before/after, the test split), ``continue_training`` 0 with ERNIE's initialisation, exact resume, and
one clear error for bad keys."""

from __future__ import annotations

import json
import math
import shutil
import sys
import os

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(__file__))
from _pretrain_job import make_pretrain_job, pretrain_config, losses  # noqa: E402
from tests._scripts import load_script  # noqa: E402

from paddlenlp_ext.trainer.pretraining_arguments import (PreTrainingArguments, padded_vocab_size,  # noqa: E402
                                                         pretraining_lr_lambda, pretraining_sample_counts)


@pytest.fixture(scope="module")
def run_pretrain():
    return load_script("llm/run_pretrain.py")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_pretrain_job(tmp_path_factory.mktemp("pretrain"))


def _argv(tmp_path, cfg: dict, *extra) -> list[str]:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return [str(path), *extra]


def test_schedules_match_paddlenlp():
    cos = pretraining_lr_lambda("cosine", 1.0, 0.1, 2, 10)
    lin = pretraining_lr_lambda("linear", 1.0, 0.1, 2, 10)
    assert [round(cos.lr_at(t), 6) for t in (1, 2, 4, 6, 10, 11)] == [0.5, 1.0, 0.868198, 0.55, 0.1, 0.1]
    assert [round(lin.lr_at(t), 6) for t in (4, 6)] == [0.775, 0.55]
    assert cos(0) == 0.5 and cos(3) == pytest.approx(0.868198, abs=1e-6)  # LambdaLR step s runs update s + 1


def test_sample_counts_and_vocab_rounding(tmp_path):
    ta = PreTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, per_device_eval_batch_size=2,
                              max_steps=100, gradient_accumulation_steps=8, eval_steps=20, do_train=True,
                              do_eval=True, do_predict=True)
    assert pretraining_sample_counts(ta, 4) == (6400, 480, 800)
    assert [padded_vocab_size(0, v) for v in (32000, 50257, 65000, 151643)] == [32000, 50304, 65024, 151680]
    assert padded_vocab_size(50400, 50257) == 50400


def test_pretrain_job_with_document_masks(run_pretrain, job, tmp_path):
    summary = run_pretrain.main(_argv(tmp_path, pretrain_config(job, "out_doc", do_predict=True)))
    for key in ("eval_loss_before", "eval_ppl_before", "eval_loss_after", "eval_ppl_after", "test_loss", "test_ppl"):
        assert math.isfinite(summary[key]), key
    assert summary["eval_ppl_after"] == pytest.approx(math.exp(summary["eval_loss_after"]))
    assert summary["global_step"] == 6 and (job / "out_doc" / "model.safetensors").is_file()
    state = json.loads((job / "out_doc" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["data_order"]["train_samples"] == 12 and state["data_order"]["reset_attention_mask"] is True
    lrs = [h["lr"] for h in state["log_history"] if "lr" in h]
    want = pretraining_lr_lambda("cosine", 3e-3, 3e-4, 1, 6)
    assert lrs == pytest.approx([want.lr_at(t + 1) for t in range(1, 7)], rel=1e-6)  # lr logged after step t


def test_resume_equals_uninterrupted_run(run_pretrain, job, tmp_path):
    cfg = pretrain_config(job, "out_full", do_eval=False)
    run_pretrain.main(_argv(tmp_path, cfg))
    resumed = job / "out_resumed"
    resumed.mkdir()
    shutil.copytree(job / "out_full" / "checkpoint-3", resumed / "checkpoint-3")
    run_pretrain.main(_argv(tmp_path, {**cfg, "output_dir": str(resumed)}))
    assert losses(resumed, 6) == losses(job / "out_full", 6)
    full, again = load_file(str(job / "out_full" / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    for k in full:
        torch.testing.assert_close(again[k], full[k], rtol=0, atol=0)


def test_plain_causal_windows_differ_from_document_masks(run_pretrain, job, tmp_path):
    plain = run_pretrain.main(_argv(tmp_path, pretrain_config(job, "out_plain", flash_mask=False, max_steps=1,
                                                              save_steps=100)))
    doc = run_pretrain.main(_argv(tmp_path, pretrain_config(job, "out_doc1", max_steps=1, save_steps=100)))
    assert plain["eval_loss_before"] != doc["eval_loss_before"]  # same samples, other attention


def test_continue_training_0_builds_ernie_with_its_init(run_pretrain, tmp_path):
    from paddlenlp_ext.transformers import AutoTokenizer

    model_args, data_args, training_args = run_pretrain.parse_args(
        ["--model_name_or_path", "ernie/tiny-random-ernie", "--tokenizer_name_or_path",
         "HuggingFaceTB/SmolLM2-135M-Instruct", "--input_dir", "x", "--output_dir", str(tmp_path / "o"),
         "--max_steps", "2", "--max_seq_length", "8192", "--num_hidden_layers", "2", "--continue_training", "0"])
    tok = AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path)
    torch.manual_seed(0)
    model = run_pretrain.build_model(model_args, data_args, training_args, tok)
    cfg = model.config
    assert cfg.max_position_embeddings == 8192 and cfg.vocab_size == padded_vocab_size(49152, len(tok))
    assert cfg.num_hidden_layers == 2
    std = math.sqrt(0.3333 / cfg.hidden_size)
    assert cfg.initializer_range == pytest.approx(std)
    emb = model.model.embed_tokens.weight
    assert emb.std().item() == pytest.approx(std, rel=0.02)
    down = model.model.layers[-1].mlp.down_proj.weight
    assert down.std().item() == pytest.approx(std / math.sqrt(2 * 2), rel=0.05)


def test_bad_keys_give_one_clear_error(run_pretrain, job, tmp_path):
    with pytest.raises(ValueError, match=r"split='9;1' does not parse"):
        run_pretrain.parse_args(_argv(tmp_path, pretrain_config(job, "o", split="9;1")))
    with pytest.raises(ValueError, match=r"input_dir is required"):
        run_pretrain.parse_args(_argv(tmp_path, {**pretrain_config(job, "o"), "input_dir": None}))
    with pytest.raises(ValueError, match=r"reset_attention_mask=true needs flash_mask=true"):
        run_pretrain.parse_args(_argv(tmp_path, pretrain_config(job, "o", flash_mask=False,
                                                                reset_attention_mask=True)))
    with pytest.raises(ValueError, match=r"max_steps must be > 0 for pretraining"):
        run_pretrain.parse_args(_argv(tmp_path, pretrain_config(job, "o", max_steps=-1)))
    with pytest.raises(ValueError, match=r"split='0,1,0' leaves the train split"):
        run_pretrain.main(_argv(tmp_path, pretrain_config(job, "out_err", split="0,1,0")))


def test_scale_loss_with_bf16_is_warned(run_pretrain, job, tmp_path, caplog):
    with caplog.at_level("WARNING"):
        run_pretrain.parse_args(_argv(tmp_path, pretrain_config(job, "o", bf16=True, scale_loss=512)))
    assert "scale_loss=512 has no effect: bf16 needs no loss scaling" in caplog.text


@pytest.mark.parametrize("config", ["config/smollm2/pretrain.json", "config/ernie35se/pretrain.json",
                                    "config/ernie35se/pretrain_3b.json"])
def test_configs_parse(run_pretrain, config):
    from tests._scripts import ROOT

    model_args, data_args, training_args = run_pretrain.parse_args([str(ROOT / config)])
    assert data_args.input_dir and training_args.max_steps > 0 and training_args.decay_steps == training_args.max_steps
    if config.endswith("3b.json"):  # the article's command
        assert (data_args.split, data_args.max_seq_length, training_args.sharding) == ("949,50,1", 4096, "stage2")
        assert (training_args.learning_rate, training_args.min_learning_rate) == (3e-4, 3e-5)
        assert model_args.continue_training is False and training_args.recompute


def test_bundled_corpus_is_the_jsonl_tokenised():
    from tests._scripts import ROOT

    from paddlenlp_ext.datasets.pretraining import IndexedTokens
    from paddlenlp_ext.transformers import AutoTokenizer

    corpus = IndexedTokens(str(ROOT / "data" / "pretrain" / "botchan"))
    tok = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")
    texts = [json.loads(line)["text"] for line in (ROOT / "data" / "pretrain" / "botchan.jsonl").open()]
    assert len(corpus) == len(texts) == 142 and corpus.meta["vocab_size"] == len(tok)
    for i in (0, 71, 141):
        assert corpus.get(i).tolist() == tok.encode(texts[i], add_special_tokens=False) + [tok.eos_token_id]
