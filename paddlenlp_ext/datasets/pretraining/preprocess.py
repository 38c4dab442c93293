"""Per-document work of ``llm/tools/preprocess/create_pretraining_data.py``, importable by its worker processes.

PaddleNLP ``create_pretraining_data.py`` (``Converter.encode``): the ``json_key`` text of each line, runs of one
character longer than ``max_repeated_len`` collapsed to one copy, each sentence tokenised without special tokens,
the eos appended to the last sentence, empty sentences and documents dropped.
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterator

_STATE: dict = {}


def input_files(path: str) -> list[str]:
    """The jsonl files of ``path`` (a file, or a directory walked recursively), sorted."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--input_path {path} does not exist")
    found = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith((".jsonl", ".zst")))
    if not found:
        raise FileNotFoundError(f"--input_path {path} holds no *.jsonl file")
    return found


def _open_text(path: str):
    if path.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise ValueError(f"{path}: reading .zst needs the zstandard package (pip install zstandard)") from None
        import io

        return io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")), encoding="utf-8")
    return open(path, encoding="utf-8")


def read_lines(files: list[str], max_docs: int) -> Iterator[tuple[str, int, str]]:
    """``(file, line number, line)`` of every non-blank line, at most ``max_docs``."""
    n = 0
    for path in files:
        with _open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if n >= max_docs:
                    return
                if line.strip():
                    n += 1
                    yield path, lineno, line


def init_worker(tokenizer_path: str, json_key: str, split: str | None, append_eos: bool, max_repeat: int) -> None:
    """Load the tokenizer and the settings of :func:`encode` into this process."""
    from paddlenlp_ext.transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    _STATE.update(tok=tok, key=json_key, split=split, eos=tok.eos_token_id if append_eos else None,
                  repeat=re.compile(r"(.)\1{%d,}" % max_repeat, re.DOTALL))


def split_sentences(text: str, mode: str | None) -> list[str]:
    """``[text]`` (``mode`` None), its lines (``"newline"``, PaddleNLP's Chinese splitter) or its sentences
    (``"sentence"``: after ``.``, ``!`` or ``?`` and whitespace; PaddleNLP uses NLTK punkt)."""
    if mode is None:
        return [text]
    if mode == "newline":
        return text.split("\n")
    return re.split(r"(?<=[.!?])\s+", text)


def encode(item: tuple[str, int, str]):
    """``(file, line, sequences or None, error or None)`` for one input line (runs in a worker)."""
    path, lineno, line = item
    try:
        record = json.loads(line)
    except ValueError as e:
        return path, lineno, None, f"not JSON ({e})"
    if not isinstance(record, dict) or _STATE["key"] not in record:
        return path, lineno, None, f"no {_STATE['key']!r} key (set --json_key)"
    text = _STATE["repeat"].sub(r"\1", str(record[_STATE["key"]]))
    tok = _STATE["tok"]
    seqs = [tok.encode(s.strip(), add_special_tokens=False) for s in split_sentences(text, _STATE["split"])]
    seqs = [s for s in seqs if s]
    if seqs and _STATE["eos"] is not None:
        seqs[-1] = seqs[-1] + [_STATE["eos"]]
    return path, lineno, seqs, None
