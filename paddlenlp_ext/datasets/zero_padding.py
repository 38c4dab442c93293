"""ZeroPadding packing: several tokenized examples per row of ``max_length`` tokens.

Source: PaddleNLP ``paddlenlp/datasets/zero_padding_dataset.py`` (``ZeroPadding``, ``generate_greedy_packs``,
``ZeroPaddingMapDataset``, ``ZeroPaddingIterableDataset``), spec 2.4.

- Non-greedy (sequential first-fit): append records while the pack has room, else emit it and open a new one.
- Greedy (``greedy_zero_padding``): records are buffered 500 at a time; inside a buffer each record, in order,
  goes into the open pack with the most room left (worst-fit, first on ties), opening a new pack when none
  fits; packs are emitted in the order they were opened.
- Records longer than ``max_length`` are dropped and counted in a warning, in every mode (PaddleNLP drops
  them silently, and its iterable non-greedy path emits them as oversize packs).

Inside a pack (:func:`concat_records`): token keys are concatenated, ``position_ids`` are kept as they are (they
restart at 0 per example), ``attn_mask_startend_row_indices`` get the example's offset within the pack
(``[n]*n`` of an example placed at offset ``o`` becomes ``[o+n]*n``), and index keys such as
``response_indexs`` get the offset on their position entries. Worked pack of two examples of 6 and 4 tokens
(``<s> a b c x y`` and ``<s> d e z``): ``position_ids = 0..5 0..3``, ``startend = 6 6 6 6 6 6 10 10 10 10``.
Padding to ``max_length`` is the collator's job (:mod:`paddlenlp_ext.datasets.collate`).
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

logger = logging.getLogger(__name__)

GREEDY_BUFFER = 500
STARTEND = "attn_mask_startend_row_indices"
#: per-token keys concatenated as they are (any that a record has)
TOKEN_KEYS = ("input_ids", "labels", "position_ids", "chosen_labels", "rejected_labels",
              "response_0_labels", "response_1_labels")
#: index keys -> how many leading entries of each index row are token positions (offset when packing)
INDEX_KEYS = {"response_indexs": 3}


def concat_records(records: Sequence[dict], token_keys: Sequence[str] = TOKEN_KEYS,
                   index_keys: Optional[Dict[str, int]] = None) -> Dict[str, list]:
    """Concatenate tokenized records into one pack (PaddleNLP ``ZeroPadding._pad_batch_records``).

    Args:
        records: dicts with ``input_ids`` (length ``n_r``) and optionally the other ``token_keys`` (length
            ``n_r``), ``attn_mask_startend_row_indices`` (``n_r`` ints, or ``n_r`` lists of C ints, relative to
            the record; default ``[n_r] * n_r``) and ``index_keys`` entries (one row ``[p0, p1, ..., extra]`` or
            a list of such rows per record).
        token_keys: per-token keys to concatenate unchanged.
        index_keys: ``{key: k}``: the first ``k`` entries of each row are positions and get the record's
            offset; the rest are kept. Default :data:`INDEX_KEYS` (``response_indexs``: 3, PaddleNLP's DPO
            form ``[chosen_start, rejected_start, end, sort]``; use 2 for RM's ``[chosen_end, rejected_end]``).

    Returns:
        A pack dict: token keys of length ``N = sum(n_r)``, ``attn_mask_startend_row_indices`` of length N
        (offset), each index key as a list of rows (offset), and ``seq_lens`` (list of ``n_r``).

    Raises:
        ValueError: no records, a record without ``input_ids``, or a token key whose length differs from
            ``input_ids`` (naming the key and the record index).
    """
    if not records:
        raise ValueError("concat_records needs at least one record")
    index_keys = INDEX_KEYS if index_keys is None else index_keys
    present = [k for k in token_keys if k in records[0]]
    pack: Dict[str, list] = {k: [] for k in present}
    pack[STARTEND] = []
    for k in index_keys:
        if k in records[0]:
            pack[k] = []
    pack["seq_lens"] = []
    offset = 0
    for r_idx, rec in enumerate(records):
        if "input_ids" not in rec:
            raise ValueError(f"record {r_idx} has no input_ids (keys {sorted(rec)})")
        n = len(rec["input_ids"])
        for k in present:
            if k not in rec or len(rec[k]) != n:
                raise ValueError(f"record {r_idx}: {k!r} has length {len(rec.get(k, []))}, input_ids has {n}; "
                                 f"all records of a pack need the same per-token keys")
            pack[k].extend(rec[k])
        se = rec.get(STARTEND)
        if se is None:
            se = [n] * n
        elif len(se) != n:
            raise ValueError(f"record {r_idx}: {STARTEND} has length {len(se)}, input_ids has {n}")
        # the startend values are rows of this record; shift them to rows of the pack
        pack[STARTEND].extend([[v + offset for v in x] if isinstance(x, (list, tuple)) else x + offset for x in se])
        for k, n_pos in index_keys.items():
            if k not in pack:
                continue
            rows = rec.get(k, [])
            rows = [rows] if rows and not isinstance(rows[0], (list, tuple)) else rows
            for row in rows:
                pack[k].append([v + offset if j < n_pos else v for j, v in enumerate(row)])
        pack["seq_lens"].append(n)
        offset += n
    return pack


def _length(rec: dict) -> int:
    return len(rec["input_ids"])


def generate_greedy_packs(records: Sequence[dict], max_length: int) -> List[List[dict]]:
    """Worst-fit packing of one buffer, in record order (PaddleNLP ``generate_greedy_packs``).

    Every record must already satisfy ``len(input_ids) <= max_length``. Example (max_length=12): lengths
    ``[7, 6, 5, 4, 3, 9]`` -> packs of lengths ``[[7, 4], [6, 5], [3, 9]]``.
    """
    packs: List[List[dict]] = []
    left: List[int] = []
    for rec in records:
        n = _length(rec)
        best = max(range(len(left)), key=lambda i: (left[i], -i)) if left else -1  # argmax, first on ties
        if best < 0 or n > left[best]:
            packs.append([])
            left.append(max_length)
            best = len(left) - 1
        packs[best].append(rec)
        left[best] -= n
    return packs


def iter_packs(records: Iterable[dict], max_length: int, greedy: bool = False, stats: Optional[dict] = None,
               buffer_size: int = GREEDY_BUFFER, one_per_pack: bool = False) -> Iterator[List[dict]]:
    """Group a stream of tokenized records into packs (lists of records), dropping oversize records.

    ``one_per_pack=True`` puts each record in its own pack (the unpacked path, ``zero_padding=False``).

    ``stats`` (optional dict) gets ``records`` (read), ``dropped`` (longer than ``max_length``) and
    ``packs`` (emitted). A warning gives the drop count when the stream ends.
    Example (non-greedy, max_length=12): lengths ``[7, 6, 5, 4, 3, 9, 13]`` -> ``[7], [6, 5], [4, 3], [9]``;
    13 is dropped.
    """
    stats = stats if stats is not None else {}
    for k in ("records", "dropped", "packs"):
        stats.setdefault(k, 0)
    cur: List[dict] = []
    cur_len = 0
    for rec in records:
        stats["records"] += 1
        n = _length(rec)
        if n > max_length:
            stats["dropped"] += 1
            continue
        if greedy:
            if len(cur) == buffer_size:
                for pack in generate_greedy_packs(cur, max_length):
                    stats["packs"] += 1
                    yield pack
                cur = []
            cur.append(rec)
            continue
        if cur and (one_per_pack or cur_len + n > max_length):
            stats["packs"] += 1
            yield cur
            cur, cur_len = [], 0
        cur.append(rec)
        cur_len += n
    if cur:
        for pack in (generate_greedy_packs(cur, max_length) if greedy else [cur]):
            stats["packs"] += 1
            yield pack
    if stats["dropped"]:
        logger.warning("dropped %d of %d records longer than max_length=%d tokens while packing",
                       stats["dropped"], stats["records"], max_length)


class ZeroPaddingMapDataset(Dataset):
    """Packs every record up front (PaddleNLP ``ZeroPaddingMapDataset``, ``lazy=False``).

    Args:
        data: a sequence (or iterable) of tokenized records (see :func:`concat_records`).
        tokenizer: accepted for PaddleNLP's signature; unused.
        max_length: pack capacity in tokens.
        greedy_zero_padding: worst-fit over 500-record buffers instead of sequential first-fit.
        index_keys: see :func:`concat_records`.
        one_per_pack: one record per pack (no packing; ``zero_padding=False``).

    ``self[i]`` is the i-th pack dict. Shuffling is the sampler's job: the trainer stores epoch and step and
    reshuffles with :func:`shuffled_indices` (seeded) on resume. ``self.stats`` holds the counts.
    """

    def __init__(self, data: Iterable[dict], tokenizer=None, max_length: int = 2048,
                 greedy_zero_padding: bool = False, index_keys: Optional[Dict[str, int]] = None,
                 one_per_pack: bool = False):
        self.max_length = max_length
        self.stats: dict = {}
        packs = iter_packs(data, max_length, greedy_zero_padding and not one_per_pack, self.stats,
                           one_per_pack=one_per_pack)
        self.packs = [concat_records(p, index_keys=index_keys) for p in packs]

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, idx: int) -> dict:
        return self.packs[idx]


class ZeroPaddingIterableDataset(IterableDataset):
    """Packs on the fly (PaddleNLP ``ZeroPaddingIterableDataset``, ``lazy=True``); no ``__len__``, no shuffle.

    Args:
        data: a re-iterable source of tokenized records (a list, an IterableDataset, or a zero-argument
            callable returning a fresh iterator); each ``__iter__`` restarts it from the beginning.
        tokenizer: accepted for PaddleNLP's signature; unused.
        max_length, greedy_zero_padding, index_keys, one_per_pack: as :class:`ZeroPaddingMapDataset`.
        num_shards, shard_index: keep only packs ``k`` with ``k % num_shards == shard_index`` (e.g. one shard
            per data-parallel rank); DataLoader workers subdivide further the same way.

    Resume: ``state_dict()`` gives ``{"packs_emitted", "records_consumed"}`` counted over all shards (global
    pack index of the next pack, and raw records read to produce it). ``load_state_dict(state)`` makes the
    next ``__iter__`` replay the packing deterministically and skip the first ``packs_emitted`` packs, so
    the next pack is exactly the one after the last consumed (unlike PaddleNLP, which skips raw records
    and loses buffered ones). With DataLoader workers the counters live in the workers: the trainer should
    restore from its own count of consumed packs, ``load_state_dict({"packs_emitted": n})`` with
    ``n = global_step * per_device_batch * grad_accum * data_parallel_world``.
    """

    def __init__(self, data, tokenizer=None, max_length: int = 2048, greedy_zero_padding: bool = False,
                 index_keys: Optional[Dict[str, int]] = None, num_shards: int = 1, shard_index: int = 0,
                 one_per_pack: bool = False):
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index must be in [0, num_shards={num_shards}), got {shard_index}")
        self.data = data
        self.max_length = max_length
        self.greedy = greedy_zero_padding and not one_per_pack
        self.one_per_pack = one_per_pack
        self.index_keys = index_keys
        self.num_shards, self.shard_index = num_shards, shard_index
        self.stats: dict = {}
        self._skip = 0
        self._emitted = 0

    def _records(self) -> Iterator[dict]:
        return iter(self.data() if callable(self.data) and not hasattr(self.data, "__iter__") else self.data)

    def state_dict(self) -> Dict[str, int]:
        """``{"packs_emitted": global packs produced so far, "records_consumed": raw records read}``."""
        return {"packs_emitted": self._emitted, "records_consumed": self.stats.get("records", 0)}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Resume after ``state["packs_emitted"]`` packs on the next ``__iter__``."""
        if "packs_emitted" not in state or state["packs_emitted"] < 0:
            raise ValueError(f"state must hold a non-negative 'packs_emitted', got {state}")
        self._skip = int(state["packs_emitted"])

    def __iter__(self) -> Iterator[dict]:
        worker = get_worker_info()
        shards, index = self.num_shards, self.shard_index
        if worker is not None:
            shards, index = shards * worker.num_workers, index * worker.num_workers + worker.id
        skip, self._skip = self._skip, 0
        self.stats = {}
        self._emitted = 0
        for k, pack in enumerate(iter_packs(self._records(), self.max_length, self.greedy, self.stats,
                                                    one_per_pack=self.one_per_pack)):
            self._emitted = k + 1
            if k < skip or k % shards != index:
                continue
            yield concat_records(pack, index_keys=self.index_keys)


def shuffled_indices(n: int, seed: int, epoch: int) -> List[int]:
    """The order of ``n`` map-style packs in ``epoch``: a permutation from ``torch.Generator`` seeded with
    ``seed + epoch``, so a resumed run (same seed, epoch) sees the same order and skips ``step`` batches."""
    g = torch.Generator()
    g.manual_seed(int(seed) + int(epoch))
    return torch.randperm(n, generator=g).tolist()
