"""llm/predict.py with ERNIE-3.5-SE's predictor options: src-only records, --predict_file, --tgt_length, batched
generation equal to one at a time, the ERNIE KV cache equal to no cache, repetition penalty, sampling defaults,
pos_decoding_interval."""

import json
import os
import shutil

import pytest
import torch

from paddlenlp_ext.transformers.batch_generation import (
    ERNIE_SAMPLING,
    apply_repetition_penalty,
    generate_batch,
    pos_decoding_interval,
)
from paddlenlp_ext.transformers.ernie35 import BUNDLED_TOKENIZER_DIR, Ernie35Config, Ernie35ForCausalLM
from paddlenlp_ext.transformers.ernie35.positions import resolve_position_ids
from tests._scripts import load_script

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33]]


def _model(random_ids=True, seed=0, vocab=97):
    torch.manual_seed(seed)
    cfg = Ernie35Config.from_pretrained("ernie/tiny-random-ernie", hidden_size=64, intermediate_size=96,
                                        num_attention_heads=4, num_hidden_layers=4, vocab_size=vocab,
                                        max_position_embeddings=512, enable_random_position_ids=random_ids)
    model = Ernie35ForCausalLM(cfg).eval()
    with torch.no_grad():  # larger logits than the init: greedy choices are far from ties
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return model


@pytest.mark.parametrize("random_ids", [True, False])
def test_kv_cache_equals_no_cache_and_batched_equals_alone(random_ids):
    model = _model(random_ids)
    cached = generate_batch(model, PROMPTS, 12, pad_token_id=0, use_cache=True)
    plain = generate_batch(model, PROMPTS, 12, pad_token_id=0, use_cache=False)
    alone = [generate_batch(model, [p], 12, pad_token_id=0, use_cache=False)[0] for p in PROMPTS]
    assert cached == plain == alone
    with torch.no_grad():  # and what the model's own forward gives, recomputing the whole prefix each token
        x = torch.tensor([PROMPTS[0]])
        for _ in range(12):
            x = torch.cat([x, model(x)[:, -1].argmax(-1, keepdim=True)], 1)
    assert x[0, len(PROMPTS[0]):].tolist() == cached[0]


def test_kv_cache_logits_match_the_full_forward():
    model = _model()
    ids = torch.tensor([PROMPTS[0] + [40, 41, 42]])
    with torch.no_grad():
        full = model(ids)
        cache = model.make_kv_cache(1, ids.shape[1])
        steps = [model(ids[:, :7], kv_cache=cache)[:, -1]] + [model(ids[:, i:i + 1], kv_cache=cache)[:, -1]
                                                             for i in range(7, ids.shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 6:], rtol=1e-4, atol=1e-4)
    assert len(cache.k) == 3  # the FFN-only tail layer holds no keys


def test_fixed_decoding_interval_spaces_positions():
    pos = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    got = resolve_position_ids(pos, 2, 5, max_pos=512, random_ids=True, training=False, seed=0, device="cpu",
                               interval=3)
    assert got.tolist() == [[2, 2, 2, 5, 8], [2, 5, 8, 11, 14]]  # I * (p + 1) - 1
    model = _model()
    model.model.pos_decoding_interval = 3
    assert generate_batch(model, PROMPTS, 8, pad_token_id=0) == \
        generate_batch(model, PROMPTS, 8, pad_token_id=0, use_cache=False)


def test_pos_decoding_interval_rule(monkeypatch):
    monkeypatch.delenv("pos_decoding_interval", raising=False)
    assert pos_decoding_interval(32768, 1024, 1024) == 8
    assert pos_decoding_interval(32768, 4096, 4096) == 4  # past 4096: max_pos // (src + tgt)
    assert pos_decoding_interval(4096, 8000, 2000) == 1
    monkeypatch.setenv("pos_decoding_interval", "5")
    assert pos_decoding_interval(32768, 1024, 1024) == 5
    assert pos_decoding_interval(32768, 1024, 1024, given=2) == 2
    monkeypatch.setenv("pos_decoding_interval", "x")
    with pytest.raises(ValueError, match="pos_decoding_interval='x'"):
        pos_decoding_interval(32768, 1024, 1024)


def test_repetition_penalty_lowers_only_seen_tokens():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    assert apply_repetition_penalty(logits, seen, 2.0).tolist() == [[1.0, -4.0, 1.0, -1.0]]
    model = _model(random_ids=False)
    with torch.no_grad():
        model.lm_head.bias.fill_(50.0)  # every logit positive: a penalised token drops below every unseen one
        model.lm_head.bias[9] += 100.0  # a favourite token
    plain = generate_batch(model, [[5, 6]], 16, pad_token_id=0)[0]
    assert plain == [9] * 16  # greedy repeats it
    penalised = generate_batch(model, [[5, 6]], 16, pad_token_id=0, repetition_penalty=1e4)[0]
    assert len(set(penalised)) == len(penalised) and not {5, 6} & set(penalised)


@pytest.fixture(scope="module")
def ernie_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_ernie_predict")
    model = _model(vocab=4096)
    model.save_pretrained(str(path))
    for f in os.listdir(BUNDLED_TOKENIZER_DIR):
        shutil.copy(os.path.join(BUNDLED_TOKENIZER_DIR, f), path)
    return str(path)


def test_src_only_records_batched_equal_one_by_one(ernie_dir, tmp_path):
    predict = load_script("llm/predict.py", "llm_predict_ernie")
    data = tmp_path / "dev.json"
    rows = [{"src": "Hello there"}, {"src": ["What is your name?"]}, {"src": "a b", "tgt": "c"},
            {"src": "The Broncos took an early lead in Super Bowl 50 and never trailed."}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outs = []
    for bs in (1, 3):
        out = tmp_path / f"pred{bs}.json"
        assert predict.main(["--model_name_or_path", ernie_dir, "--data_file", str(data), "--predict_file", str(out),
                             "--tgt_length", "6", "--batch_size", str(bs), "--src_length", "64",
                             "--num_threads", "1"]) == 0
        outs.append([json.loads(line) for line in out.read_text().splitlines()])
    assert outs[0] == outs[1]
    assert [sorted(o) for o in outs[0]] == [["output", "src"], ["output", "src"], ["output", "src", "tgt"],
                                            ["output", "src"]]
    assert all(o["output"] for o in outs[0])


def test_record_without_src_fails_before_the_model_loads(tmp_path):
    predict = load_script("llm/predict.py", "llm_predict_ernie")
    data = tmp_path / "dev.json"
    data.write_text('{"src": "q"}\n{"question": "q"}\n')
    with pytest.raises(ValueError, match=rf"{data}:2: no \"src\""):
        predict.main(["--model_name_or_path", "/nonexistent/model", "--data_file", str(data)])
    data.write_text('{"src": ["a", "b"]}\n')
    with pytest.raises(ValueError, match=rf"{data}:1: \"src\" has 2 turns but there is no \"tgt\""):
        predict.main(["--model_name_or_path", "/nonexistent/model", "--data_file", str(data)])


def test_sampling_takes_ernie_defaults(ernie_dir, monkeypatch, capsys):
    predict = load_script("llm/predict.py", "llm_predict_ernie_sampling")
    seen = {}

    def fake(model, prompts, max_new_tokens, **kw):
        seen.update(kw, max_new_tokens=max_new_tokens)
        return [[7] for _ in prompts]

    monkeypatch.setattr(predict, "generate_batch", fake)
    assert predict.main(["--model_name_or_path", ernie_dir, "--prompt", "hi", "--decode_strategy", "sampling",
                         "--tgt_length", "5", "--repetition_penalty", "1.3", "--num_threads", "1"]) == 0
    assert {k: seen[k] for k in ERNIE_SAMPLING} == ERNIE_SAMPLING and seen["do_sample"]
    assert seen["max_new_tokens"] == 5 and seen["repetition_penalty"] == 1.3
    assert "pos_decoding_interval 8" in capsys.readouterr().err
    predict.main(["--model_name_or_path", ernie_dir, "--prompt", "hi", "--decode_strategy", "sampling",
                  "--top_k", "7", "--pos_decoding_interval", "2", "--repetition_penalty", "1.1", "--num_threads", "1"])
    assert seen["top_k"] == 7 and seen["temperature"] == ERNIE_SAMPLING["temperature"]
    assert "pos_decoding_interval 2" in capsys.readouterr().err
