"""Data pipeline: PaddleNLP jsonl reading, SFT tokenization, ZeroPadding packing and the packed-batch collator.

``jsonl`` (reading, validation, directory layout), ``sft`` (tokenization and truncation), ``zero_padding``
(packing, map and iterable datasets), ``collate`` (padding into the docs/design.md batch dict), ``builder``
(``DataArgument`` -> datasets + collator). Preference data lives in ``preference``.
"""

from .builder import create_sft_datasets, make_sft_collator, resolve_chat_template, set_chat_template
from .collate import PackCollator, collate_packs
from .jsonl import check_sft_record, iter_jsonl, read_jsonl, sft_data_files
from .sft import IGNORE_INDEX, tokenize_sft_example, tokenize_sft_examples
from .zero_padding import (
    ZeroPaddingIterableDataset,
    ZeroPaddingMapDataset,
    concat_records,
    generate_greedy_packs,
    iter_packs,
    shuffled_indices,
)

__all__ = [
    "IGNORE_INDEX",
    "PackCollator",
    "ZeroPaddingIterableDataset",
    "ZeroPaddingMapDataset",
    "check_sft_record",
    "collate_packs",
    "concat_records",
    "create_sft_datasets",
    "generate_greedy_packs",
    "iter_jsonl",
    "iter_packs",
    "make_sft_collator",
    "read_jsonl",
    "resolve_chat_template",
    "set_chat_template",
    "sft_data_files",
    "shuffled_indices",
    "tokenize_sft_example",
    "tokenize_sft_examples",
]
