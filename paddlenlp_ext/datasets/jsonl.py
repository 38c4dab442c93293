"""Reading PaddleNLP's SFT jsonl and its directory layout, with errors that name the file and line.

Format (PaddleNLP ``llm/utils/data.py``, spec 2.1): one JSON object per line,
``{"src": str | [str], "tgt": str | [str], "context": {...}?}``; ``src[i]`` is the i-th user turn and
``tgt[i]`` the i-th assistant answer, so list lengths must match. Blank lines are skipped; other keys are
kept (and ignored by the tokenizer).

Directory layout (PaddleNLP ``create_dataset``): ``<dir>/train.json`` and ``<dir>/dev.json`` (and
``test.json``), or else ``<dir>/train/*.json``, ``<dir>/dev/*.json``.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Callable, Dict, Iterator, List, Optional

logger = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
#: ``context`` keys that clash with ``tokenizer.apply_chat_template``'s own arguments (or the render's ``messages``)
RESERVED_CONTEXT_KEYS = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


def check_sft_record(record: dict) -> dict:
    """Validate one SFT record and normalise ``src``/``tgt`` to equal-length lists of strings.

    Returns a new dict (``src``/``tgt`` as lists, other keys kept). An instruction record
    (``instruction``/``input``/``output``) is converted first (``task_data.instruction_to_sft``).

    Raises:
        ValueError: not an object, ``src`` or ``tgt`` missing, not a string / list of strings, empty lists,
            lists of different lengths, ``context`` not an object or holding a key of
            :data:`RESERVED_CONTEXT_KEYS` (an argument of ``apply_chat_template``). The message is the rule and the fix;
            :func:`iter_jsonl` prefixes the file and line.
    """
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object {{\"src\": ..., \"tgt\": ...}}, got {type(record).__name__}")
    from .task_data import instruction_to_sft

    record = instruction_to_sft(record)  # {"instruction", "input", "output"} (finetune_generation.py's format)
    missing = [k for k in ("src", "tgt") if k not in record]
    if missing:
        raise ValueError(f"missing key(s) {missing}; an SFT record needs \"src\" (user turns) and \"tgt\" "
                         f"(assistant answers), got keys {sorted(record)}")
    if "response" in record and "sort" in record:
        raise ValueError("this is a preference record (response/sort keys), not SFT {\"src\", \"tgt\"}: train on it "
                         "with llm/run_dpo.py or llm/run_reward.py (train_dataset_path), or give SFT data")
    out = dict(record)
    for key in ("src", "tgt"):
        value = record[key]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"\"{key}\" must be a string or a list of strings, got {json.dumps(record[key])[:80]}")
        if not value:
            raise ValueError(f"\"{key}\" is an empty list; give at least one turn")
        out[key] = value
    if len(out["src"]) != len(out["tgt"]):
        raise ValueError(f"\"src\" has {len(out['src'])} turns but \"tgt\" has {len(out['tgt'])}; each user turn "
                         f"src[i] needs its answer tgt[i]")
    if "context" in record and not isinstance(record["context"], dict):
        raise ValueError(f"\"context\" must be a JSON object, got {type(record['context']).__name__}")
    reserved = sorted(set(record.get("context") or {}) & RESERVED_CONTEXT_KEYS)
    if reserved:
        # context is passed as keyword arguments to apply_chat_template / the Jinja render: these names are
        # already arguments there, and a TypeError deep inside the tokenizer would not name the line
        raise ValueError(f"\"context\" key(s) {reserved} are arguments of apply_chat_template, not template "
                         f"variables; rename them (context holds extra variables for the chat template)")
    return out


_WARNED: set = set()  # (path, mtime_ns, size, what) already warned about: a lazy stream re-reads its file each epoch


def warn_once_per_file(path: str, what: str, message: str) -> None:
    """Log ``message`` (a warning) once per ``path`` version and ``what`` in this process, so a data file that is
    re-read every epoch does not repeat the same warning."""
    try:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_mtime_ns, st.st_size, what)
    except OSError:
        key = (os.path.abspath(path), None, None, what)
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(message)


def summarize_lines(where: List[str], limit: int = 3) -> str:
    """``["f:2", "f:9", ...]`` -> ``"f:2, f:9, ..."`` (the first ``limit`` locations)."""
    return ", ".join(where[:limit]) + (", ..." if len(where) > limit else "")


def jsonl_objects(path: str, kind: str) -> Iterator[tuple]:
    """``(where, obj)`` for each non-blank line of a jsonl file, ``where`` = ``"<path>:<line>"``.

    ``kind`` names the expected content in errors (e.g. ``'SFT {"src", "tgt"}'``).

    Raises:
        FileNotFoundError: ``path`` does not exist, or is a directory (the message says which).
        ValueError: ``<path>:<line>: ...`` for a line that is not UTF-8 or not valid JSON (with the column).
            A UTF-8 byte-order mark at the start of the file is skipped. When the whole file is one JSON
            document (an array of records, or one pretty-printed object) the error says so and how to convert it.
    """
    if os.path.isdir(path):
        raise FileNotFoundError(f"{path!r} is a directory; give the jsonl file of {kind} records inside it")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file {path!r} does not exist (expected jsonl of {kind} records)")
    first = True  # the first non-blank line: where a whole-file JSON document (array, pretty-printed) shows
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                # utf-8-sig on line 1: a byte-order mark (Windows editors) is not part of the first record
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start} of the line); "
                                 f"save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line.rstrip("\r\n"))  # so that e.colno is on this line, not after it
            except json.JSONDecodeError as e:
                hint = _whole_document_hint(path) if first else ""
                raise ValueError(f"{where}: invalid JSON at column {e.colno}: {e.msg} "
                                 f"(each line must be one JSON object){hint}") from None
            if first and isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
                hint = _whole_document_hint(path)[2:] or "a JSON array of objects; write each object on its own line"
                raise ValueError(f"{where}: {hint}")
            first = False
            yield where, obj


def _whole_document_hint(path: str) -> str:
    """``"; <what and how to fix>"`` when the whole file is one JSON document instead of jsonl (a JSON array of
    records, or one pretty-printed object over several lines; PaddleNLP reads jsonl only), else ``""``."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
        doc = json.loads(text)
    except OSError:
        return ""
    except ValueError:
        n = _count_concatenated_objects(text)
        if n < 2:
            return ""
        return (f"; the file holds {n} JSON objects, each spread over several lines (pretty-printed), but the format "
                f"is jsonl: put each record on a single line (e.g. jq -c . {path} > converted.json)")
    if isinstance(doc, list):
        return (f"; the file is one JSON array of {len(doc)} item(s), but the format is jsonl (one object per line). "
                "Convert it: python -c \"import json,sys; [print(json.dumps(r, ensure_ascii=False)) for r in "
                f"json.load(open(sys.argv[1]))]\" {path} > converted.json")
    if isinstance(doc, dict):
        return ("; the file is one JSON object spread over several lines (pretty-printed), but the format is jsonl: "
                "put each record on a single line")
    return ""


def _count_concatenated_objects(text: str) -> int:
    """How many JSON objects ``text`` is, one after another with only whitespace between; 0 if it is not that."""
    decoder, i, n = json.JSONDecoder(), 0, 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return n
        try:
            obj, i = decoder.raw_decode(text, i)
        except ValueError:
            return 0
        if not isinstance(obj, dict):
            return 0
        n += 1


def iter_jsonl(path: str, validate: Optional[Callable[[dict], dict]] = check_sft_record) -> Iterator[dict]:
    """Yield the records of a jsonl file, each passed through ``validate`` (None = no check).

    With the default ``validate``, records whose answer (a ``tgt`` turn) is empty or only whitespace are kept, as
    PaddleNLP does, but counted: once the file is read, one warning names the count and the first lines (such a
    record trains the model to end its turn without replying).

    Raises:
        ValueError: ``<path>:<line>: <problem>`` for a line that is not UTF-8, invalid JSON (with the column)
            or a record that ``validate`` rejects; ``<path>: empty file`` when the file holds no record.
        FileNotFoundError: the file does not exist (or is a directory).
    """
    count, empty_answer = 0, []
    for where, record in jsonl_objects(path, 'SFT {"src", "tgt"}'):
        if validate is not None:
            try:
                record = validate(record)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if validate is check_sft_record and any(not t.strip() for t in record["tgt"]):
                empty_answer.append(where)
        count += 1
        yield record
    if count == 0:
        raise ValueError(f"{path}: empty file (no JSON records); expected one {{\"src\", \"tgt\"}} object per line")
    if empty_answer:  # "tgt": "" trains the end-of-turn token right after the question
        warn_once_per_file(path, "empty tgt", (
            f"{path}: {len(empty_answer)} of {count} SFT records have an empty answer (a \"tgt\" turn that is empty or "
            f"only whitespace), at {summarize_lines(empty_answer)}: they are trained as they are (PaddleNLP's rule) "
            "and teach the model to end its turn without replying; fill in the answers or remove those lines"))


def read_jsonl(path: str, validate: Optional[Callable[[dict], dict]] = check_sft_record) -> List[dict]:
    """All records of a jsonl file as a list; see :func:`iter_jsonl` for validation and errors."""
    return list(iter_jsonl(path, validate))


def sft_data_files(dataset_name_or_path: str) -> Dict[str, List[str]]:
    """Map split name -> jsonl files, following PaddleNLP's ``create_dataset`` layout.

    ``<dir>/{train,dev,test}.json`` when ``train.json`` or ``dev.json`` exists, else sorted
    ``<dir>/{split}/*.json``. A single file path is taken as the train split. Splits without files are
    omitted.

    Raises:
        ValueError: the path does not exist, the directory holds neither layout, or it mixes them
            (``dev.json`` beside ``train/*.json``: the split directory would be ignored).
    """
    path = dataset_name_or_path
    if path is None:
        raise ValueError("dataset_name_or_path is not set; give a directory with train.json/dev.json")
    if os.path.isfile(path):
        return {"train": [path]}
    if not os.path.isdir(path):
        where = "" if os.path.isabs(path) else f"; relative paths are read from the current directory {os.getcwd()}"
        raise ValueError(f"dataset_name_or_path {path!r} is neither a directory nor a file "
                         f"(built-in dataset names are not supported{where})")
    files: Dict[str, List[str]] = {}
    if os.path.isfile(os.path.join(path, "train.json")) or os.path.isfile(os.path.join(path, "dev.json")):
        for split in SPLITS:
            p = os.path.join(path, f"{split}.json")
            if os.path.isfile(p):
                files[split] = [p]
        # the flat layout wins as soon as train.json or dev.json exists (PaddleNLP's rule): a split kept in its
        # directory beside it would be ignored without a word, so a mix of the two layouts is refused
        mixed = [s for s in ("train", "dev") if s not in files and glob.glob(os.path.join(path, s, "*.json"))]
        if mixed:
            flat = " and ".join(f"{s}.json" for s in files)
            dirs = " and ".join(f"{s}/*.json" for s in mixed)
            raise ValueError(f"{path}: mixes the two data layouts, {flat} beside {dirs}: when train.json or dev.json "
                             f"exists only <split>.json files are read (PaddleNLP's rule), so {dirs} would be "
                             f"ignored. Use one layout: concatenate {mixed[0]}/*.json into {mixed[0]}.json, or move "
                             f"each <split>.json into <split>/")
    else:
        for split in SPLITS:
            found = sorted(glob.glob(os.path.join(path, split, "*.json")))
            if found:
                files[split] = found
            # PaddleNLP's layout reads *.json only: a part named *.jsonl is skipped, so it is warned
            skipped = sorted(glob.glob(os.path.join(path, split, "*.jsonl")))
            if skipped and files:
                names = ", ".join(os.path.basename(f) for f in skipped[:3]) + (", ..." if len(skipped) > 3 else "")
                logger.warning("%s: %d file(s) ignored (%s): the %s split reads %s/*.json only; rename them to "
                               ".json to use them", os.path.join(path, split), len(skipped), names, split, split)
    if not files:
        near = sorted(glob.glob(os.path.join(path, "*.jsonl")) + glob.glob(os.path.join(path, "*", "*.jsonl")))
        hint = (f" (found {', '.join(os.path.relpath(f, path) for f in near[:3])}: the files must be named .json, "
                "e.g. train.jsonl -> train.json)") if near else ""
        raise ValueError(f"{path}: no data found; expected {path}/train.json (+ dev.json) or "
                         f"{path}/train/*.json (+ dev/*.json), jsonl of {{\"src\", \"tgt\"}}{hint}")
    return files
