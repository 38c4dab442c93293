"""From ``DataArgument`` to train/dev datasets and a collator (PaddleNLP ``run_finetune.py`` data flow).

``files -> read_jsonl (validated) -> tokenize_sft_examples -> ZeroPadding{Map,Iterable}Dataset -> PackCollator``

- ``zero_padding``: packs of up to ``max_length`` tokens; greedy (worst-fit) on the train split only when
  ``greedy_zero_padding``; the dev split is packed sequentially.
- no ``zero_padding``: every example is its own row (a one-record pack), padded to ``max_length`` when
  ``pad_to_max_length``, else to the longest row (rounded up to ``pad_to_multiple_of``).
- ``lazy``: the train split streams (read, tokenize, pack on the fly; resumable, see
  :class:`~paddlenlp_ext.datasets.zero_padding.ZeroPaddingIterableDataset`); dev is always map-style.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Iterator, List, Optional

from .collate import PackCollator
from .jsonl import iter_jsonl, sft_data_files
from .sft import AUTO, tokenize_sft_examples
from .zero_padding import ZeroPaddingIterableDataset, ZeroPaddingMapDataset


def resolve_chat_template(chat_template: Optional[str]):
    """``DataArgument.chat_template`` -> the argument of :func:`~paddlenlp_ext.datasets.sft.tokenize_sft_example`.

    None -> ``"auto"`` (the tokenizer's own template); ``"none"`` -> None (no template); a directory ->
    ``<dir>/chat_template.jinja`` (as transformers saves it, e.g. a trained output_dir), else
    ``<dir>/chat_template.json``; a file -> its Jinja text, or its ``"chat_template"`` string if it is a JSON
    object (Hugging Face ``tokenizer_config.json`` style).

    Raises:
        ValueError: the path does not exist, or the file is PaddleNLP's ``ChatTemplate`` JSON
            (``system``/``conversation``/``query``), which this build does not render.
    """
    if chat_template is None:
        return AUTO
    if chat_template.strip().lower() == "none":
        return None
    path = chat_template
    if os.path.isdir(path):
        # chat_template.jinja: what transformers 5 (hence every output_dir of ours) saves; .json: PaddleNLP's name
        found = [os.path.join(path, n) for n in ("chat_template.jinja", "chat_template.json")
                 if os.path.isfile(os.path.join(path, n))]
        if not found:
            raise ValueError(f"chat_template {chat_template!r}: the directory holds neither chat_template.jinja nor "
                             "chat_template.json (give 'none', a Jinja file, or a dir holding one of them)")
        path = found[0]
    if not os.path.isfile(path):
        raise ValueError(f"chat_template {chat_template!r}: no such file (give 'none', a Jinja file, or a dir "
                         f"holding chat_template.jinja or chat_template.json)")
    # utf-8-sig: a byte-order mark (Windows editors) would otherwise be rendered into every prompt, and would
    # make a JSON file fail to parse and be taken for Jinja text
    with open(path, encoding="utf-8-sig") as f:
        text = f.read()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text  # a plain Jinja file
    if isinstance(obj, dict) and isinstance(obj.get("chat_template"), str):
        return obj["chat_template"]
    if isinstance(obj, dict) and "conversation" in obj:
        raise ValueError(f"{path}: PaddleNLP ChatTemplate JSON (system/conversation/query) is not supported; "
                         f"write the template as Jinja ({{\"chat_template\": \"...\"}} or a .jinja file)")
    raise ValueError(f"{path}: expected a Jinja template or a JSON object with a \"chat_template\" string")


def set_chat_template(tokenizer, chat_template: Optional[str]):
    """Put ``DataArgument.chat_template`` on the tokenizer, so the after-training chat and the saved tokenizer (hence
    ``llm/predict.py``) render prompts the way the model was trained: a file's template replaces the tokenizer's,
    ``"none"`` clears it (prompts then use the no-template SFT layout), None keeps the tokenizer's own.

    PaddleNLP's launchers do the same (``tokenizer.init_chat_template``), so the saved tokenizer carries the
    template trained on. Returns :func:`resolve_chat_template`'s value.

    Raises:
        ValueError: as :func:`resolve_chat_template`.
    """
    template = resolve_chat_template(chat_template)
    if template != AUTO and hasattr(tokenizer, "chat_template"):
        tokenizer.chat_template = template  # None for "none"
    return template


def _stream(files: List[str]) -> Iterator[dict]:
    for path in files:
        yield from iter_jsonl(path)


class _TokenizedStream:
    """Re-iterable stream of tokenized records (re-reads the files on every ``iter``)."""

    def __init__(self, files, tokenizer, src_length, max_length, chat_template):
        self.files, self.tokenizer = files, tokenizer
        self.src_length, self.max_length, self.chat_template = src_length, max_length, chat_template
        self.stats: dict = {}

    def __iter__(self):
        self.stats = {}
        return tokenize_sft_examples(_stream(self.files), self.tokenizer, self.src_length, self.max_length,
                                     self.chat_template, self.stats)


def create_sft_datasets(data_args, tokenizer, splits=("train", "dev")) -> Dict[str, object]:
    """Build the datasets of ``splits`` that exist under ``data_args.dataset_name_or_path``.

    Returns ``{split: dataset}`` whose items are pack dicts for :class:`PackCollator`. Missing splits are
    left out. Reading errors name the file and line; examples and records that cannot fit are dropped with a
    warning giving the count.
    """
    files = sft_data_files(data_args.dataset_name_or_path)
    template = resolve_chat_template(data_args.chat_template)
    out: Dict[str, object] = {}
    for split in splits:
        if split not in files:
            continue
        stream = _TokenizedStream(files[split], tokenizer, data_args.src_length, data_args.max_length, template)
        greedy = data_args.greedy_zero_padding and data_args.zero_padding and split == "train"
        one = not data_args.zero_padding  # unpacked: every example is its own row
        if data_args.lazy and split == "train":
            out[split] = ZeroPaddingIterableDataset(stream, tokenizer, data_args.max_length, greedy, one_per_pack=one)
        else:
            out[split] = ZeroPaddingMapDataset(stream, tokenizer, data_args.max_length, greedy, one_per_pack=one)
    return out


def make_sft_collator(data_args, tokenizer) -> PackCollator:
    """The collator of ``run_finetune.py``: pad to ``max_length`` with ``zero_padding`` or
    ``pad_to_max_length``, else dynamically (to ``pad_to_multiple_of``). Pad id: the tokenizer's pad id, else
    its EOS (PaddleNLP's Llama rule), else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    pad = 0 if pad is None else pad
    fixed = data_args.zero_padding or data_args.pad_to_max_length
    return PackCollator(data_args.max_length, pad, None if fixed else (data_args.pad_to_multiple_of or 1))
