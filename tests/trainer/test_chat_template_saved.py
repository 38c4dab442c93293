"""``chat_template`` of ``run_finetune.py`` reaches the saved tokenizer and the after-training chat.

PaddleNLP sets a ``chat_template`` file on the tokenizer (``init_chat_template``) and saves that tokenizer with the
model, so ``predict.py`` renders prompts the way the model was trained. A template file must therefore be the
saved template, and ``chat_template: "none"`` (plain ``<bos> user`` + ``reply </s>`` turns) must save a tokenizer
without one, so that ``llm/predict.py`` uses the same no-template layout; the after-training chat must work then.
"""

from __future__ import annotations

import json

from transformers import AutoTokenizer

PLAIN = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant: {% endif %}")


def _run(tmp_path, make_tiny_sft_job, chat_template: str):
    from trainer_fixtures import load_run_finetune

    job = make_tiny_sft_job(tmp_path, n_train=4, n_dev=1)
    cfg = {"model_name_or_path": str(job / "model"), "dataset_name_or_path": str(job / "data"),
           "output_dir": str(job / "out"), "per_device_train_batch_size": 1, "max_steps": 1, "learning_rate": 1e-3,
           "save_strategy": "no", "max_length": 96, "src_length": 48, "flash_mask": True, "do_train": True,
           "do_eval": False, "disable_tqdm": True, "chat_after_train": True, "chat_max_new_tokens": 2,
           "chat_template": chat_template}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    summary = load_run_finetune().main([str(path)])
    return summary, job / "out"


def test_template_file_is_saved_with_the_model(tmp_path, make_tiny_sft_job):
    tpl = tmp_path / "plain.jinja"
    tpl.write_text(PLAIN)
    summary, out = _run(tmp_path, make_tiny_sft_job, str(tpl))
    assert "chat" in summary
    assert AutoTokenizer.from_pretrained(str(out)).chat_template == PLAIN


def test_template_none_saves_no_template_and_still_chats(tmp_path, make_tiny_sft_job):
    summary, out = _run(tmp_path, make_tiny_sft_job, "none")
    assert isinstance(summary["chat"]["reply"], str)  # the chat ran in the no-template layout
    assert not AutoTokenizer.from_pretrained(str(out)).chat_template


def test_overwrite_with_template_none_drops_the_old_template_file(tmp_path, make_tiny_sft_job):
    """A first run saves ``chat_template.jinja``; ``overwrite_output_dir`` with ``chat_template: none`` must not leave
    it behind (transformers would load it back as the template of a model trained without one)."""
    from trainer_fixtures import load_run_finetune

    summary, out = _run(tmp_path, make_tiny_sft_job, str(_write_plain(tmp_path)))
    assert (out / "chat_template.jinja").is_file()
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    cfg.update(chat_template="none", overwrite_output_dir=True)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    load_run_finetune().main([str(tmp_path / "cfg.json")])
    assert not AutoTokenizer.from_pretrained(str(out)).chat_template


def _write_plain(tmp_path):
    tpl = tmp_path / "plain.jinja"
    tpl.write_text(PLAIN)
    return tpl
