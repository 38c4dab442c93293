"""``PdArgumentParser``: PaddleNLP-compatible JSON + command-line parsing into typed dataclasses.

Matches ``paddlenlp/trainer/argparser.py`` (``PdArgumentParser.parse_json_file_and_cmd_lines``): the launcher
is called as ``python run_X.py cfg.json [--key value ...]``; the JSON is read first and command-line
``--key value`` pairs override it (the command line wins). Every key must be a field of one of the
dataclasses (PaddleNLP raises on unknown keys too).

Differences from PaddleNLP (all stricter or more informative):

- Values are converted from the field's type annotation (``bool`` from ``true/false/1/0/yes/no``,
  ``int``, ``float``, ``str``, ``Optional[...]``, ``List[...]``) and every problem (unknown key with the
  nearest valid keys, bad value, missing required field, ``__post_init__`` errors of every dataclass) is
  collected and raised as one ``ValueError`` (one problem: that line alone; several: a count, then a line each).
- Command-line mistakes name the flag: ``--key`` without a value (last argument, or followed by another
  ``--flag``; bare ``--flag`` means true only for bool keys), an unknown ``--key``, a key given twice (also as
  ``--key=value``), several words for a one-value key, a stray value (or a config file not given first).
- A key present in several dataclasses is set in all of them (PaddleNLP's argparse would refuse the
  duplicate option; here e.g. ``benchmark`` can live in a DataArgument and in the training arguments).
- Fields marked ``metadata={"inert": "<reason>"}`` are accepted but not acted on by this build; when such
  keys are set, ONE warning lists them all with their reasons. When a key gets implemented, remove its
  ``inert`` marker.
- Invalid JSON is reported with file, line and column; duplicate keys in one JSON object are an error.
- List-typed keys (``report_to``, ``lora_target_modules``, ...) take on the command line what the JSON takes:
  a JSON list (``--report_to []``, ``--report_to '["tensorboard"]'``), comma-separated values
  (``--report_to tensorboard,visualdl``) or several words (``--lora_target_modules q_proj v_proj``); ``none`` /
  ``null`` gives None. A value starting with ``[`` that is not a list is an error (PaddleNLP's argparse,
  ``nargs="+"``, would keep ``'[]'`` as a one-element list of the string ``'[]'``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import re
import sys
import types
import typing
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}
_NONE = {"none", "null"}

_SFT, _DPO, _PREF = "llm/run_finetune.py (SFT/LoRA)", "llm/run_dpo.py (DPO)", "llm/run_dpo.py or llm/run_reward.py"
#: keys that only another launcher takes: an unknown key found here names that launcher (a config given to the
#: wrong launcher, e.g. run_finetune.py config/smollm2/dpo.json, otherwise gets look-alike suggestions only)
OTHER_LAUNCHER_KEYS = {
    **dict.fromkeys(("dataset_name_or_path", "src_length", "max_length", "zero_padding", "merge_weights"), _SFT),
    **dict.fromkeys(("beta", "loss_type", "label_smoothing", "simpo_gamma", "dpop_lambda", "pref_loss_ratio",
                     "sft_loss_ratio", "reference_free", "ref_model_update_steps", "precompute_reference_logps"),
                    _DPO),
    **dict.fromkeys(("train_dataset_path", "dev_dataset_path", "max_seq_len", "max_prompt_len"), _PREF),
    **dict.fromkeys(("lora", "lora_rank", "lora_alpha", "rslora", "lora_path", "lora_target_modules",
                     "lora_plus_scale"), "llm/run_finetune.py or llm/run_dpo.py (the reward model has no LoRA)"),
}


def inert(reason: str, **metadata) -> Dict[str, Any]:
    """Field metadata marking a key as accepted-but-not-acted-on, with the ``reason`` shown in the warning."""
    return {"inert": reason, **metadata}


def _unwrap_optional(tp) -> Tuple[Any, bool]:
    """``Optional[X]`` -> ``(X, True)``; anything else -> ``(tp, False)``."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
        return typing.Union[tuple(args)], True
    return tp, False


def _type_name(tp) -> str:
    if typing.get_origin(tp) is typing.Union:  # Union[str, bool] -> "str or bool" (its __name__ is "Union")
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert_scalar(value: Any, tp, from_cli: bool) -> Any:
    """Convert one scalar to ``tp`` (bool, int, float, str, Literal or a Union of those)."""
    if typing.get_origin(tp) is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ValueError(f"must be one of {list(allowed)}, got {value!r}")
        return value
    if typing.get_origin(tp) is typing.Union:  # e.g. Union[str, List[str]]: first member that accepts it
        errors = []
        for member in typing.get_args(tp):
            try:
                return _convert_value(value, member, from_cli)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError("; ".join(errors))
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ValueError(f"expected a bool (true/false; 1/0 and yes/no also work), got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"expected an int, got bool {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
            try:
                f = float(value.strip())
            except ValueError:
                f = None
            if f is not None and f.is_integer():
                return int(f)
        raise ValueError(f"expected an int, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"expected a float, got bool {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ValueError(f"expected a float, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # PaddleNLP turns the JSON into CLI strings, so 8 -> "8" is accepted
        raise ValueError(f"expected a string, got {type(value).__name__} {value!r}")
    if tp is Any or tp is object:
        return value
    if tp is dict or typing.get_origin(tp) is dict:
        if isinstance(value, dict):
            return value
        if isinstance(value, str) and from_cli:
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"expected a JSON object, got {value!r} ({e.msg})") from None
            if isinstance(parsed, dict):
                return parsed
        raise ValueError(f"expected a JSON object, got {value!r}")
    raise ValueError(f"unsupported field type {_type_name(tp)}")


def _convert_value(value: Any, tp, from_cli: bool) -> Any:
    """Convert a JSON value or a list of command-line strings to the annotated type ``tp``.

    Command-line values arrive as a list of strings (``--report_to a b`` -> ``["a", "b"]``); a scalar field
    takes exactly one.
    """
    inner, optional = _unwrap_optional(tp)
    origin = typing.get_origin(inner)
    if from_cli and isinstance(value, list) and origin not in (list, tuple):
        if len(value) != 1:
            raise ValueError(f"expected one value, got {len(value)}: {value}")
        value = value[0]
    if value is None:
        if optional:
            return None
        raise ValueError(f"null is not allowed (type {_type_name(inner)})")
    if optional and from_cli and isinstance(value, str) and value.strip().lower() in _NONE and inner is not str:
        return None
    if optional and from_cli and isinstance(value, list) and len(value) == 1 \
            and isinstance(value[0], str) and value[0].strip().lower() in _NONE:
        return None
    if origin in (list, tuple):
        (elem,) = typing.get_args(inner)[:1] or (Any,)
        if from_cli and isinstance(value, str):
            value = [value]
        if from_cli and isinstance(value, list) and all(isinstance(v, str) for v in value):
            parsed = _cli_list(value)
            if parsed is not None:  # a JSON list: its items are JSON values, converted as the config's are
                return [_convert_value(v, elem, False) for v in parsed]
            value = [v.strip() for tok in value for v in tok.split(",") if v.strip()]
        elif isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, got {value!r}")
        return [_convert_value(v, elem, from_cli) for v in value]
    return _convert_scalar(value, inner, from_cli)


def _cli_list(words: List[str]) -> Optional[list]:
    """The command-line words of a list-typed key written as a JSON list, parsed; None when they are not one.

    ``--report_to []`` -> ``[]``; ``--report_to '["tensorboard", "visualdl"]'`` -> both; the shell's split of an
    unquoted ``[a, b]`` (``["[a,", "b]"]``) and ``[a,b]`` without quotes -> ``["a", "b"]``. Words that do not start
    with ``[`` are not a JSON list (None: the caller splits them on commas, ``a,b`` or ``a b``).

    Raises:
        ValueError: the words start with ``[`` but are neither valid JSON nor a bracketed comma list, or hold
            nested lists/objects; the message shows both accepted spellings.
    """
    text = " ".join(words).strip()
    quoted = text[1:].lstrip()[:1] in ("\"", "'")  # ["a"... or ['a'...: meant as a JSON list
    if not text.startswith("[") or not (text.endswith("]") or quoted):
        return None  # e.g. a regex such as [qv]_proj for lora_target_modules
    fix = ("write a JSON list such as '[]' or '[\"a\", \"b\"]' (quote it for the shell), or comma-separated "
           "values such as a,b")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        inner = text[1:-1]
        if any(c in inner for c in "\"'{}") or not text.endswith("]"):
            raise ValueError(f"cannot read {text!r} as a list ({e.msg} at character {e.pos}); {fix}") from None
        if any(c in inner for c in "[]"):
            return None  # brackets inside and no quotes: regex character classes such as [qv]_pro[j]
        return [v.strip() for v in inner.split(",") if v.strip()]  # [a, b] without quotes
    if not isinstance(parsed, list) or any(isinstance(v, (list, dict)) for v in parsed):
        raise ValueError(f"cannot read {text!r} as a flat list of values; {fix}")
    return parsed


def _load_json(path: str) -> Dict[str, Any]:
    """Read a JSON object; errors name the file, line and column."""
    if not os.path.isfile(path):
        raise ValueError(f"config file {path!r} does not exist")

    def no_duplicates(pairs):
        seen = {}
        for k, v in pairs:
            if k in seen:
                raise ValueError(f"{path}: duplicate key {k!r} in a JSON object; keep one")
            seen[k] = v
        return seen

    with open(path, "rb") as f:
        raw = f.read()
    try:
        # utf-8-sig: a byte-order mark (Windows editors save one) is not part of the JSON
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(f"{path}:{line}:{col}: not UTF-8 (byte 0x{raw[e.start]:02x}); save the config file as "
                         "UTF-8") from None
    if not text.strip():
        raise ValueError(f"{path}: the config file is empty; it must hold a JSON object {{\"key\": value, ...}} "
                         "(see config/ for examples)")
    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        hint = ""
        if text[: e.pos].rstrip().endswith(","):  # {"a": 1,} or [1,]: JSON allows no trailing comma
            hint = " (a trailing comma before this point? JSON allows none: remove the last ',')"
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}{hint}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a JSON object {{\"key\": value, ...}}, "
                         f"got {type(data).__name__}")
    return data


def _split_cli(argv: Sequence[str], followers: Optional[Dict[str, Optional[str]]] = None
               ) -> Tuple[Dict[str, List[str]], List[str]]:
    """``["--a", "1", "--flag", "--b=x"]`` -> ``({"a": ["1"], "flag": [], "b": ["x"]}, errors)``.

    ``followers``, when given, receives for each ``--key`` written without a value the argument after it
    (the next ``--flag``, or None at the end), so a missing value can be reported precisely.
    """
    out: Dict[str, List[str]] = {}
    errors: List[str] = []
    key = None
    for i, tok in enumerate(argv):
        if tok.startswith("--") and len(tok) > 2:
            name, eq, val = tok[2:].partition("=")
            name = name.replace("-", "_")
            if name in out:
                errors.append(f"command line: --{name} given twice; keep one")
            out[name] = [val] if eq else []
            key = None if eq else name
            if not eq and followers is not None:
                followers[name] = argv[i + 1] if i + 1 < len(argv) and argv[i + 1].startswith("--") else None
        elif key is None:
            hint = ("the config file must be the first argument: run.py CONFIG.json [--key value ...]"
                    if _is_config_path(tok) else "values must follow a --key")
            errors.append(f"command line: unexpected value {tok!r} ({hint})")
        else:
            out[key].append(tok)
    return out, errors


def _is_config_path(token: str) -> bool:
    return token.lower().endswith((".json", ".yaml", ".yml"))


def _looks_like_path(token: str) -> bool:
    """A token that is meant as a file: it exists, holds a path separator or ends in a file extension."""
    return not token.startswith("--") and (os.path.exists(token) or "/" in token or os.sep in token
                                           or re.search(r"\.[A-Za-z]\w*$", token) is not None)


def _not_a_config_path(token: str) -> str:
    """The error for a first argument that is not a ``--key`` and not a ``.json`` / ``.yaml`` path (a mistyped or
    missing config file, or its directory): what it is, and the config files nearby."""
    folder = token if os.path.isdir(token) else os.path.dirname(token) or "."
    found = sorted(f for f in os.listdir(folder) if _is_config_path(f)) if os.path.isdir(folder) else []
    if os.path.isdir(token):
        what = f"{token!r} is a directory"
    elif os.path.exists(token):
        what = f"{token!r} does not end in .json, .yaml or .yml"
    else:
        what = f"config file {token!r} does not exist"
        close = difflib.get_close_matches(os.path.basename(token), found, n=1)
        if close:
            what += f" (did you mean {os.path.join(os.path.dirname(token), close[0])!r}?)"
    nearby = (f" ({folder} holds: {', '.join(found[:8])}{', ...' if len(found) > 8 else ''})" if found else "")
    return (f"{what}. The first argument must be a config file: run.py CONFIG.json [--key value ...], or only "
            f"--key value ...{nearby}")


def _no_value_error(key: str, tp, follower: Optional[str]) -> str:
    """The one-line error of ``--key`` given without a value (``tp``: the field's type)."""
    inner, optional = _unwrap_optional(tp)
    if typing.get_origin(inner) in (list, tuple):
        (elem,) = typing.get_args(inner)[:1] or (Any,)
        kind = f"one or more {_type_name(elem)} values"
    else:
        kind = _type_name(inner)
    kind += ", or none" if optional else ""
    where = f"it is followed by {follower.split('=')[0]}" if follower else "it is the last argument"
    return (f"command line: --{key} needs a value ({kind}) but {where}; write --{key} <value> "
            f"(or --{key}=<value>)")


class PdArgumentParser:
    """Parse a JSON config and ``--key value`` overrides into instances of ``dataclass_types``.

    Args:
        dataclass_types: one dataclass type or a sequence of them (e.g.
            ``(ModelArgument, DataArgument, SFTConfig)``). Returned instances keep this order.

    Raises (from the ``parse_*`` methods):
        ValueError: unknown keys (with the nearest valid keys), values of the wrong type, missing required
            keys, invalid JSON (file:line:column) and the dataclasses' own ``__post_init__`` errors, all
            collected into one message.

    Source: ``paddlenlp/trainer/argparser.py`` (``PdArgumentParser``).
    """

    def __init__(self, dataclass_types):
        if dataclasses.is_dataclass(dataclass_types):
            dataclass_types = [dataclass_types]
        self.dataclass_types = list(dataclass_types)
        if not self.dataclass_types or not all(dataclasses.is_dataclass(t) for t in self.dataclass_types):
            raise ValueError(f"PdArgumentParser needs dataclass types, got {dataclass_types!r}")
        self._fields: List[Dict[str, dataclasses.Field]] = []
        self._hints: List[Dict[str, Any]] = []
        for t in self.dataclass_types:
            self._fields.append({f.name: f for f in dataclasses.fields(t) if f.init})
            self._hints.append(typing.get_type_hints(t))
        #: (key, reason) of the inert keys set by the last parse
        self.inert_keys_set: List[Tuple[str, str]] = []

    @property
    def valid_keys(self) -> List[str]:
        """Every key accepted by at least one of the dataclasses, sorted."""
        return sorted({k for fields in self._fields for k in fields})

    def _suggest(self, key: str) -> str:
        if key in OTHER_LAUNCHER_KEYS:
            return f": it is a key of {OTHER_LAUNCHER_KEYS[key]}; use that launcher, or remove the key"
        close = difflib.get_close_matches(key, self.valid_keys, n=3, cutoff=0.6)
        if not close:  # no close spelling: keys that contain it or that it contains (e.g. "lora" in "lora_rank")
            close = [k for k in self.valid_keys if key in k or k in key][:3]
        return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""

    def parse_dict(self, values: Dict[str, Any], source: str = "dict",
                   cli: Optional[Dict[str, List[str]]] = None, errors: Optional[List[str]] = None,
                   cli_followers: Optional[Dict[str, Optional[str]]] = None):
        """Build the dataclasses from a dict of JSON values, then apply ``cli`` string overrides.

        Returns a tuple with one instance per dataclass type. ``source`` names the dict in messages;
        ``cli_followers`` (from ``_split_cli``) names what followed a ``--key`` given without a value.
        One problem is raised as its own line; several as a list under a count.
        """
        errors = list(errors or [])
        cli = cli or {}
        cli_followers = cli_followers or {}
        failed = set()  # keys whose given value was rejected: not reported "missing" a second time
        kwargs: List[Dict[str, Any]] = [{} for _ in self.dataclass_types]
        set_keys: List[str] = []
        # the command line wins: a key given there replaces the file's value before conversion
        items = [(k, v, False, source) for k, v in values.items() if k not in cli]
        items += [(k, v, True, "command line") for k, v in cli.items()]
        bad_class = set()  # dataclasses with a value that did not convert: their __post_init__ errors are filtered
        key_source: Dict[str, str] = {}  # key -> where its value came from (the file or "command line")
        for key, raw, from_cli, where in items:
            key_source[key] = where
            owners = [i for i, fields in enumerate(self._fields) if key in fields]
            if not owners:
                errors.append(f"{where}: unknown key {key!r}" + (self._suggest(key) or "; --help lists every key"))
                continue
            for i in owners:
                tp = self._hints[i][key]
                value = raw
                if from_cli and raw == []:
                    if _unwrap_optional(tp)[0] is not bool:
                        if i == owners[0]:
                            errors.append(_no_value_error(key, tp, cli_followers.get(key)))
                        bad_class.add(i)
                        failed.add(key)
                        continue
                    value = ["true"]  # bare --flag
                try:
                    kwargs[i][key] = _convert_value(value, tp, from_cli)
                except ValueError as e:
                    if i == owners[0]:
                        errors.append(self._value_error(key, value, tp, e, where, from_cli))
                    bad_class.add(i)
                    failed.add(key)
            if key not in set_keys:
                set_keys.append(key)

        outputs = []
        for i, t in enumerate(self.dataclass_types):
            absent = [name for name, f in self._fields[i].items()
                      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                      and name not in kwargs[i]]
            for name in absent:
                if name not in failed:  # a required key whose value did not convert is reported already
                    errors.append(f"{source}: required key {name!r} ({t.__name__}) is missing; set it in the "
                                  f"JSON or pass --{name} <value>")
            if absent:
                continue
            try:  # kwargs hold the well-typed values only: a key that did not convert keeps its default here
                outputs.append(t(**kwargs[i]))
            except ValueError as e:
                # one line per problem (ArgumentsError lists them); a problem that names a key which did not
                # convert is about the default standing in for it, already reported, so it is left out
                for msg in getattr(e, "problems", None) or [str(e)]:
                    if i in bad_class and any(re.search(rf"\b{re.escape(k)}\b", msg) for k in failed):
                        continue
                    msg = msg if msg.startswith(t.__name__) else f"{t.__name__}: {msg}"
                    errors.append(f"{self._post_init_source(msg, kwargs[i], key_source, source)}: {msg}")
        if len(errors) == 1:
            raise ValueError(errors[0])
        if errors:
            raise ValueError(f"{len(errors)} problem(s) in the arguments:\n  - " + "\n  - ".join(errors))

        self.inert_keys_set = []
        for key in set_keys:
            owners = [fields[key] for fields in self._fields if key in fields]
            # inert only when no dataclass acts on it (a key may be inert in one class and live in another)
            if owners and all("inert" in f.metadata for f in owners):
                self.inert_keys_set.append((key, owners[0].metadata["inert"]))
        if self.inert_keys_set:
            logger.warning(
                "These keys are accepted for PaddleNLP compatibility but not acted on by this build: "
                + "; ".join(f"{k} ({r})" for k, r in self.inert_keys_set))
        return tuple(outputs)

    @staticmethod
    def _post_init_source(msg: str, given: Dict[str, Any], key_source: Dict[str, str], source: str) -> str:
        """Where the values behind a dataclass's ``__post_init__`` error came from: the sources of the given keys
        the message names (the config file, "command line", or both), else the config file itself."""
        named = [k for k in given if re.search(rf"(?<![\w.-]){re.escape(k)}(?![\w-])", msg)]
        where = sorted({key_source.get(k, source) for k in named}) or [source]
        return " and ".join(where)

    @staticmethod
    def _value_error(key: str, value: Any, tp, e: ValueError, where: str, from_cli: bool) -> str:
        """One line for a value that did not convert; on the command line it names ``--key``, and several words
        given to a one-value key say how to pass them."""
        if not from_cli:
            return f"{where}: key {key!r}: {e}"
        origin = typing.get_origin(_unwrap_optional(tp)[0])
        if isinstance(value, list) and len(value) > 1 and origin not in (list, tuple):
            hint = ("the config file must be the first argument: run.py CONFIG.json [--key value ...]"
                    if any(_is_config_path(v) for v in value[1:]) else "quote a value that contains spaces")
            return f"command line: --{key} takes one value, got {len(value)}: {' '.join(value)} ({hint})"
        return f"command line: --{key}: {e}"

    def parse_json_file(self, json_file: str):
        """Parse a JSON config file (no command-line overrides). Returns one instance per dataclass type."""
        return self.parse_dict(_load_json(json_file), source=json_file)

    def parse_yaml_file(self, yaml_file: str):
        """Parse a YAML mapping (``run_finetune.py`` also accepts ``.yaml``)."""
        return self.parse_dict(self._load_yaml(yaml_file), source=yaml_file)

    @staticmethod
    def _load_yaml(path: str) -> Dict[str, Any]:
        if not os.path.isfile(path):
            raise ValueError(f"config file {path!r} does not exist")
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: a YAML config needs PyYAML, which is not installed: pip install pyyaml "
                             "(or pip install 'paddlenlp-ext[yaml]'), or write the config as JSON") from None
        with open(path, encoding="utf-8") as f:
            try:
                data = yaml.safe_load(f)
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
                raise ValueError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
        return data

    def parse_args_into_dataclasses(self, argv: Optional[Sequence[str]] = None):
        """Parse ``--key value`` arguments only (no config file). ``argv`` defaults to ``sys.argv[1:]``."""
        argv = list(sys.argv[1:] if argv is None else argv)
        if argv and _looks_like_path(argv[0]):  # a mistyped or missing config file, or its directory
            raise ValueError(_not_a_config_path(argv[0]))
        followers: Dict[str, Optional[str]] = {}
        cli, errors = _split_cli(argv, followers)
        return self.parse_dict({}, source="command line", cli=cli, errors=errors, cli_followers=followers)

    def parse_json_file_and_cmd_lines(self, argv: Optional[Sequence[str]] = None):
        """``argv = [cfg.json, --key, value, ...]``: JSON first, then the overrides (the command line wins).

        ``argv`` defaults to ``sys.argv[1:]``. A ``.yaml``/``.yml`` first argument is read as YAML.

        Raises:
            ValueError: the first argument is not a ``.json``/``.yaml`` file, or any parse problem.
        """
        argv = list(sys.argv[1:] if argv is None else argv)
        if not argv or not argv[0].lower().endswith((".json", ".yaml", ".yml")):
            raise ValueError(f"expected a .json config path as the first argument, got {argv[:1]}; "
                             f"usage: run.py config.json [--key value ...]")
        path = argv[0]
        values = self._load_yaml(path) if path.lower().endswith((".yaml", ".yml")) else _load_json(path)
        followers: Dict[str, Optional[str]] = {}
        cli, errors = _split_cli(argv[1:], followers)
        return self.parse_dict(values, source=path, cli=cli, errors=errors, cli_followers=followers)

    def format_help(self, prog: Optional[str] = None) -> str:
        """Usage line and, per dataclass, every key with its type, default and help text."""
        lines = [f"usage: {_command(prog)} CONFIG.json [--key value ...]   (or only --key value ...)",
                 "Keys come from the JSON config; --key value on the command line overrides them (PaddleNLP's "
                 "PdArgumentParser).", ""]
        inert_keys = inert_fields(self.dataclass_types)
        for t, fields, hints in zip(self.dataclass_types, self._fields, self._hints):
            lines.append(f"{t.__name__}:")
            for name, f in fields.items():
                if f.default is not dataclasses.MISSING:
                    default = repr(f.default)
                elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                    default = repr(f.default_factory())  # type: ignore[misc]
                else:
                    default = "required"
                note = " [accepted, not acted on]" if name in inert_keys else ""
                tp, optional = _unwrap_optional(hints[name])
                kind = _type_name(tp) + (" or null" if optional else "")
                desc = f.metadata.get("help", "").strip()
                desc = "" if desc.strip(". ") == "" else f": {desc}"  # an inert key's empty help printed ': .'
                lines.append(f"  --{name} ({kind}, default {default}){note}{desc}")
            lines.append("")
        return "\n".join(lines)

    def parse(self, argv: Optional[Sequence[str]] = None):
        """Dispatch like the PaddleNLP launchers: a config file first, or plain ``--key value`` arguments.
        ``-h`` / ``--help`` anywhere prints :meth:`format_help` and exits 0."""
        argv = list(sys.argv[1:] if argv is None else argv)
        if "-h" in argv or "--help" in argv:
            print(self.format_help())
            raise SystemExit(0)
        if not argv:
            raise ValueError(f"no arguments: give a JSON config first, e.g. {_command(script_dir='llm/')} "
                             "<config.json> [--key value ...] (configs in config/; --help lists the keys)")
        if argv[0].lower().endswith((".json", ".yaml", ".yml")):
            return self.parse_json_file_and_cmd_lines(argv)
        return self.parse_args_into_dataclasses(argv)


def _command(prog: Optional[str] = None, script_dir: str = "") -> str:
    """How the launcher ``prog`` (default: the running one) is typed: ``python <script_dir>run_finetune.py`` for a
    script, the bare name for an installed command (``paddlenlp-finetune``)."""
    prog = prog or os.path.basename(sys.argv[0] or "launcher")
    return f"python {script_dir}{prog}" if prog.endswith(".py") else prog


def inert_fields(dataclass_types: Iterable[type]) -> Dict[str, str]:
    """``{key: reason}`` of every field marked inert in ``dataclass_types`` (for docs and tests)."""
    out: Dict[str, str] = {}
    for t in dataclass_types:
        for f in dataclasses.fields(t):
            if "inert" in f.metadata:
                out.setdefault(f.name, f.metadata["inert"])
    return out
