"""TRL's ``SFTTrainer(padding_free=True)`` on ``attn_implementation="FlashMask"``: the flattened micro-batch's
restarting ``position_ids`` become document-isolated FlashMask vectors, so its loss equals the padded per-example
run's, and training lowers it. Skipped where TRL is not installed (it is in the ``test`` extra)."""

import pytest
import torch

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from paddlenlp_ext.transformers import hf_attention  # noqa: E402
from tests._hf_tiny import save_tiny_model_dir  # noqa: E402

TEXTS = ["The cat sat on the mat and looked at the door.", "Paris is the capital of France.",
         "A small model learns short sentences quickly.", "Rain fell all day over the quiet town.",
         "She wrote the letter and then went out.", "Numbers add up: one, two, three, four."]


def _train(path, tmp_path, impl: str, padding_free: bool, steps: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=impl, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    args = trl.SFTConfig(output_dir=str(tmp_path / f"{impl}-{padding_free}"), padding_free=padding_free,
                         per_device_train_batch_size=len(TEXTS), max_steps=steps, learning_rate=1e-2,
                         logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
                         lr_scheduler_type="constant", max_length=None)
    trainer = trl.SFTTrainer(model=model, args=args, processing_class=tok,
                             train_dataset=datasets.Dataset.from_dict({"text": TEXTS}))
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_sft_trainer_padding_free_isolates_examples_and_trains(tmp_path, monkeypatch):
    path = save_tiny_model_dir("qwen2", tmp_path / "qwen2")
    seen = []
    real = hf_attention.flashmask_attention_forward

    def spy(module, query, key, value, attention_mask, **kwargs):
        pos = kwargs.get("position_ids")
        if pos is not None:  # documents in the flattened row: positions that do not step by +1
            seen.append((query.shape[0], int((pos[:, 1:] != pos[:, :-1] + 1).sum()) + 1))
        return real(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(hf_attention, "flashmask_attention_forward", spy)
    hf_attention.register_flashmask_attention()
    try:
        flash = _train(path, tmp_path, hf_attention.FLASHMASK, True, steps=8)
    finally:
        monkeypatch.undo()
        hf_attention.register_flashmask_attention()
    padded = _train(path, tmp_path, "sdpa", False, steps=1)
    assert seen and all(b == 1 and docs == len(TEXTS) for b, docs in seen), seen[:3]
    assert flash[0] == pytest.approx(padded[0], rel=1e-4)  # isolated: the same loss as per-example padded rows
    assert flash[-1] < flash[0] - 2.0, flash
