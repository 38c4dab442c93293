"""Evaluation metrics: generation scores against hand-computed values, SFT token accuracy, and run_finetune with
eval_with_do_generation and load_best_model_at_end end to end on a tiny random Llama."""

import json
import math

import pytest
import torch

from paddlenlp_ext.trainer.eval_metrics import generation_scores, perplexity, sft_eval_loss
from paddlenlp_ext.trainer.loss import sft_loss
from trainer_fixtures import load_run_finetune, write_sft_config


def test_generation_scores_match_hand_computed_values():
    preds = ["the cat sat on the mat", "Paris."]
    refs = ["the cat is on the mat", "Paris."]
    got = generation_scores(preds, refs)
    assert got["exact_match"] == 0.5
    # corpus BLEU over 13a tokens (8 hyp, 8 ref tokens: brevity penalty 1): n-gram matches 7/8, 4/6, 1/4, 0/3;
    # sacrebleu's default "exp" smoothing turns the empty 4-gram count into 1 / (2 * 3)
    assert got["bleu4"] == pytest.approx((7 / 8 * 4 / 6 * 1 / 4 * 1 / 6) ** 0.25, rel=1e-9)
    # ROUGE-L F1: LCS "the cat on the mat" = 5 of 6 words each way; "paris" vs "paris" = 1 (punctuation dropped)
    assert got["rouge_l"] == pytest.approx((5 / 6 + 1) / 2, rel=1e-9)
    zh = generation_scores(["你好世界"], ["你好"])  # CJK characters count one by one (rouge-score's own tokenizer
    assert zh["rouge_l"] == pytest.approx(2 * (2 / 4) * 1 / (2 / 4 + 1))  # drops them and would give 0)
    with pytest.raises(ValueError, match="as many predictions as references"):
        generation_scores(["a"], [])
    assert perplexity(math.log(3.0)) == pytest.approx(3.0) and perplexity(1e4) == float("inf")


def test_sft_eval_loss_counts_argmax_hits_on_supervised_tokens(make_tiny_llama_batch):
    model, batch = make_tiny_llama_batch
    with torch.no_grad():
        loss_sum, count, metrics = sft_eval_loss(model, batch)
        ref_sum, ref_count, _ = sft_loss(model, batch, fused=False)
        logits = model(batch["input_ids"], position_ids=batch["position_ids"],
                       attn_mask_startend_row_indices=batch["attn_mask_startend_row_indices"])
    sup = batch["labels"] != -100
    assert int(count) == int(ref_count) == int(sup.sum())
    assert float(loss_sum) == pytest.approx(float(ref_sum), rel=1e-5)
    assert int(metrics["accuracy"]) == int(((logits.argmax(-1) == batch["labels"]) & sup).sum())
    with torch.no_grad():  # the logits path (a head the fused path does not take) counts the same
        model.config.use_fused_linear_cross_entropy = False
        _, _, unfused = sft_eval_loss(model, batch)
    assert int(unfused["accuracy"]) == int(metrics["accuracy"])


@pytest.fixture
def make_tiny_llama_batch():
    from paddlenlp_ext.transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    ids = torch.randint(1, 40, (2, 12))
    labels = torch.cat([ids[:, 1:], torch.zeros(2, 1, dtype=torch.long)], 1)
    labels[:, :4] = -100
    labels[0, 9:] = -100  # padding tail of row 0
    batch = {"input_ids": ids, "labels": labels, "position_ids": torch.arange(12).expand(2, 12),
             "attn_mask_startend_row_indices": torch.full((2, 1, 12, 1), 12, dtype=torch.int32)}
    return model.eval(), batch


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("evm"), n_train=12, n_dev=3)


def test_run_finetune_generation_metrics_and_best_model_export(tiny_job):
    """eval_with_do_generation: every evaluation reports accuracy, perplexity, exact_match, bleu4, rouge_l and
    writes its answers; load_best_model_at_end on accuracy: the exported model is the best checkpoint's."""
    from paddlenlp_ext.trainer import checkpoint as ckpt
    from paddlenlp_ext.transformers import AutoModelForCausalLM

    out = tiny_job / "gen"
    argv = write_sft_config(tiny_job, out, {
        "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "per_device_eval_batch_size": 2,
        "max_steps": 4, "learning_rate": 3e-3, "warmup_steps": 1, "logging_steps": 1, "max_length": 96,
        "src_length": 48, "flash_mask": True, "do_train": True, "do_eval": True, "disable_tqdm": True,
        "chat_after_train": False, "evaluation_strategy": "steps", "save_strategy": "steps", "eval_steps": 2,
        "save_steps": 2, "save_total_limit": 1, "load_best_model_at_end": True, "metric_for_best_model": "accuracy",
        "eval_with_do_generation": True, "eval_generation_max_examples": 2, "eval_generation_max_new_tokens": 3})
    summary = load_run_finetune().main(argv)
    for key in ("loss", "accuracy", "perplexity", "exact_match", "bleu4", "rouge_l"):
        assert key in summary["dev_before"] and key in summary["dev_after"], key
    assert summary["dev_after"]["perplexity"] == pytest.approx(math.exp(summary["dev_after"]["loss"]), rel=1e-4)
    lines = [json.loads(x) for x in (out / "eval_predictions" / "step-2.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and set(lines[0]) == {"src", "tgt", "output"}
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    evals = {h["step"]: h["eval_accuracy"] for h in state["log_history"] if "eval_accuracy" in h}
    best_step = max(sorted(evals), key=lambda s: evals[s])  # the first of equal values wins, as in HF
    assert summary["best_global_step"] == best_step and summary["best_model_checkpoint"].endswith(f"-{best_step}")
    assert (out / f"checkpoint-{best_step}").is_dir()  # kept by save_total_limit 1
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_job / "model"), dtype=torch.float32)
    ckpt.load_model_weights(out / f"checkpoint-{best_step}", ref)
    for (n, a), (_, b) in zip(exported.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n
