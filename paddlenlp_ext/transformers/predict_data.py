"""``llm/predict.py --data_file``: read the records, answer them in batches, write one JSON line per record.

Source: PaddleNLP's predictors (``llm/predict/predictor.py``, and ERNIE-3.5-SE's ``predict_generation.py``, whose
records may hold ``src`` only and whose ``--predict_file`` receives ``{"src", "output"}`` lines).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Sequence

__all__ = ["read_data_file", "predict_file"]


def _check_src_only(raw: dict) -> dict:
    """A record without ``tgt`` (ERNIE-3.5-SE predictor's format): one ``src`` turn, a string or a list of one."""
    src = raw["src"]
    turns = [src] if isinstance(src, str) else src
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"\"src\" must be a string or a list of strings, got {json.dumps(src)[:80]}")
    if len(turns) != 1:
        raise ValueError(f"\"src\" has {len(turns)} turns but there is no \"tgt\": a record without answers holds "
                         f"one turn; give \"tgt\" with the answers of the earlier turns")
    return {**raw, "src": turns, "tgt": []}


def read_data_file(data_file: str, output_file: str) -> list:
    """The records of the predictor's ``--data_file`` (jsonl), checked before the model is loaded:
    ``[(where, raw record, record with src/tgt as lists)]``, ``where`` = ``file:line``. A record is SFT
    ``{"src", "tgt"}`` or ``{"src"}`` alone (one turn; ``tgt`` is then ``[]``).

    Raises:
        ValueError / FileNotFoundError: a bad line (naming ``file:line``: no ``src``, or an SFT rule of
            :func:`paddlenlp_ext.datasets.jsonl.check_sft_record`), no records, or ``output_file`` is ``data_file``.
    """
    from paddlenlp_ext.datasets.jsonl import check_sft_record, jsonl_objects

    if os.path.abspath(output_file) == os.path.abspath(data_file):
        raise ValueError(f"--output_file {output_file} is the --data_file; give another file")
    records = []
    for where, raw in jsonl_objects(data_file, '{"src"} or SFT {"src", "tgt"}'):
        try:
            if isinstance(raw, dict) and "src" not in raw:
                raise ValueError(f"no \"src\" (the prompt) in this record; got keys {sorted(raw)}. Each line needs "
                                 f"{{\"src\": \"...\"}} (\"tgt\", the reference answer, is optional)")
            rec = _check_src_only(raw) if isinstance(raw, dict) and "tgt" not in raw else check_sft_record(raw)
            records.append((where, raw, rec))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    if not records:
        raise ValueError(f"--data_file {data_file}: no records; expected one {{\"src\"}} JSON object per line")
    return records


def predict_file(records: list, output_file: str, conv, respond_batch: Callable[[list], list],
                 notify: Callable[[str], None], batch_size: int = 1, to_text: Callable | None = None) -> int:
    """Answer each record of :func:`read_data_file`, ``batch_size`` prompts per generation call, and write one JSON
    line per record to ``output_file``: ``{"src", "tgt", "output"}`` (``tgt`` only when the record has it;
    ``src``/``tgt`` as in the input). Returns the number of records.

    The model sees the record's turns before the last (``src[i]``, ``tgt[i]``) as history and answers the last
    ``src`` turn; the last ``tgt`` is the reference and is not shown. (PaddleNLP: without a chat template only
    ``src[0]`` is sent; with one, every turn including the last ``tgt``.) Oldest turns are dropped past the prompt
    cap (``conv``, a ``Conversation`` of ``llm/predict.py``); a record whose last turn alone is too long gets
    ``"output": ""`` and a notice naming its line. ``respond_batch(list of prompt ids) -> list of replies``.
    """
    to_text = to_text or (lambda t, where, notify: t)
    prompts: list = []
    for where, raw, rec in records:
        conv.reset()
        text = [to_text(t, where, notify) for t in rec["src"] + rec["tgt"]]  # JSON may hold lone surrogates
        src, tgt = text[:len(rec["src"])], text[len(rec["src"]):]
        for u, a in zip(src[:-1], tgt[:-1]):
            conv.messages += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        try:
            ids, dropped = conv.prompt_for(src[-1])
            if dropped:
                notify(f"[predict] {where}: dropped the oldest {dropped} turn(s) to fit the prompt cap")
            prompts.append(ids)
        except ValueError as e:
            notify(f"[predict] {where}: not answered (\"output\": \"\"): {e}")
            prompts.append(None)
    os.makedirs(os.path.dirname(os.path.abspath(output_file)), exist_ok=True)
    with open(output_file, "w", encoding="utf-8") as f:
        for start in range(0, len(records), max(batch_size, 1)):
            chunk = list(range(start, min(start + max(batch_size, 1), len(records))))
            asked = [i for i in chunk if prompts[i] is not None]
            replies = dict(zip(asked, respond_batch([prompts[i] for i in asked]))) if asked else {}
            for i in chunk:
                _, raw, _ = records[i]
                f.write(_json_line(raw, replies.get(i, "")) + "\n")
            f.flush()
    notify(f"[predict] wrote {len(records)} prediction(s) to {output_file}")
    return len(records)


def _json_line(raw: dict, output: str) -> str:
    row = {"src": raw["src"], **({"tgt": raw["tgt"]} if "tgt" in raw else {}), "output": output}
    line = json.dumps(row, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a "\ud800" escape in the input): keep it escaped
        line = json.dumps(row)
    return line


def batches(items: Sequence, size: int):
    """``items`` in consecutive chunks of ``size``."""
    for i in range(0, len(items), size):
        yield items[i:i + size]
