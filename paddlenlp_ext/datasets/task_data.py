"""``finetune_generation.py``'s data formats turned into SFT ``{"src", "tgt"}`` records.

Source: PaddleNLP ``llm/experimental/ernie-3.5-se/data.py`` (``convert_example``) and ``finetune_generation.py``
(``--task_name`` / ``--data_name`` / ``--dataset_path``).

- Instruction records ``{"instruction", "input"?, "output"}``: ``src = instruction``, or
  ``instruction + "\\n" + input`` when ``input`` is not empty; ``tgt = output``. (PaddleNLP's ERNIE
  ``convert_example`` drops ``input``; its benchmark path joins the two without a separator.)
- SQuAD v1.1 (``--task_name squad``): one record per question, PaddleNLP's template
  ``src = "answer: {first answer} context: {context}"``, ``tgt = "question: {question}"`` (PaddleNLP appends
  ``" </s>"`` to the text; here the end-of-turn token is appended as for every SFT answer). Read from a local
  ``train-v1.1.json`` / ``dev-v1.1.json``: nothing is downloaded.
"""

from __future__ import annotations

import json
import os

__all__ = ["instruction_to_sft", "squad_records", "prepare_task_data", "SQUAD_FILES", "TASK_NAMES"]

SQUAD_FILES = {"train": "train-v1.1.json", "dev": "dev-v1.1.json"}  # the official names (PaddleNLP's train_v1/dev_v1)
TASK_NAMES = ("squad",)


def instruction_to_sft(record: dict) -> dict:
    """``{"instruction", "input"?, "output"}`` -> ``{"src", "tgt"}`` (other keys kept); other records unchanged.

    Raises:
        ValueError: ``instruction``, ``input`` or ``output`` not a string.
    """
    if not isinstance(record, dict) or "src" in record or "instruction" not in record or "output" not in record:
        return record
    inst, inp, out = record["instruction"], record.get("input", ""), record["output"]
    for key, value in (("instruction", inst), ("input", inp), ("output", out)):
        if not isinstance(value, str):
            raise ValueError(f"instruction record: \"{key}\" must be a string, got {json.dumps(value)[:80]}")
    rest = {k: v for k, v in record.items() if k not in ("instruction", "input", "output")}
    return {**rest, "src": inst + ("\n" + inp if inp.strip() else ""), "tgt": out}


def squad_records(path: str) -> list[dict]:
    """SFT records of a SQuAD v1.1 JSON file (``{"data": [{"paragraphs": [{"context", "qas": [...]}]}]}``), in
    file order; questions without an answer are skipped.

    Raises:
        ValueError: the file is not SQuAD v1.1 JSON (the message names the file and what is missing).
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}); expected SQuAD v1.1") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError(f"{path}: not SQuAD v1.1 JSON (no top-level \"data\" list of articles)")
    out = []
    for article in doc["data"]:
        for para in article.get("paragraphs", []):
            context = para.get("context", "")
            for qa in para.get("qas", []):
                answers = [a.get("text", "") for a in qa.get("answers", []) if isinstance(a, dict)]
                if not answers:
                    continue
                out.append({"src": f"answer: {answers[0]} context: {context}",
                            "tgt": f"question: {qa.get('question', '')}"})
    if not out:
        raise ValueError(f"{path}: no question with an answer (expected SQuAD v1.1: data[].paragraphs[].qas[])")
    return out


def _write_jsonl(path: str, records: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def prepare_task_data(task_name: str | None, data_name: str | None, dataset_path: str | None,
                      out_dir: str) -> str | None:
    """The SFT directory for ``finetune_generation.py``'s built-in sets: ``--task_name squad --dataset_path DIR``
    converts ``DIR/train-v1.1.json`` (and ``dev-v1.1.json`` when present) into ``out_dir/train.json`` /
    ``dev.json`` and returns ``out_dir``. Returns None when no built-in set is asked for.

    Raises:
        ValueError: ``data_name`` without ``task_name``, a set other than SQuAD, or no local copy (nothing is
            downloaded; the message says which files to put where).
    """
    if data_name and not task_name:
        raise ValueError("data_name needs task_name too (PaddleNLP: load_dataset(data_name, task_name))")
    if not task_name:
        return None
    name = (data_name or task_name).lower()
    if name not in TASK_NAMES or (data_name and task_name.lower() not in TASK_NAMES):
        asked = f"data_name={data_name!r}, task_name={task_name!r}" if data_name else f"task_name={task_name!r}"
        raise ValueError(f"{asked}: no such built-in dataset here (built in: {', '.join(TASK_NAMES)}), and nothing is "
                         f"downloaded; convert it to SFT jsonl ({{\"src\", \"tgt\"}} or {{\"instruction\", \"input\", "
                         f"\"output\"}} per line) in DIR/train.json and DIR/dev.json and pass --dataset_path DIR "
                         f"without task_name")
    train = os.path.join(dataset_path, SQUAD_FILES["train"]) if dataset_path else None
    if not train or not os.path.isfile(train):
        where = f"{dataset_path!r} has no {SQUAD_FILES['train']}" if dataset_path else "no --dataset_path was given"
        raise ValueError(f"task_name=squad reads a local copy of SQuAD v1.1 and downloads nothing: {where}. Put "
                         f"{SQUAD_FILES['train']} (and {SQUAD_FILES['dev']} for evaluation), from "
                         f"https://rajpurkar.github.io/SQuAD-explorer/, in a directory and pass --dataset_path DIR")
    for split, fname in SQUAD_FILES.items():
        src = os.path.join(dataset_path, fname)
        if os.path.isfile(src):
            _write_jsonl(os.path.join(out_dir, f"{split}.json"), squad_records(src))
    return out_dir
