"""Pretraining datasets over token files: one split of one corpus prefix (:class:`GPTDataset`), weighted blends
(:class:`BlendableDataset`), the index cache, and :func:`build_train_valid_test_datasets`.

Source: PaddleNLP ``paddlenlp/data/causal_dataset.py`` (``GPTDataset``, ``_build_index_mappings``,
``build_train_valid_test_datasets``), ``paddlenlp/data/blendable_dataset.py`` and ``llm/run_pretrain.py``
(``get_train_data_file``). Same samples in the same order for the same files, split, seed and sample count.
Differences (docs/pretraining.md): the cache key covers everything that shapes the index (the split's sequence
range and a hash of its sizes, not the prefix path, so a stale index is never reused and a moved corpus keeps its
cache); cache files are written atomically; a corpus shorter than one window is an error; ``input_dir`` listings
are sorted and only names ending in ``.idx`` / ``_idx.npz`` count.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from typing import Callable, Sequence

import numpy as np

from .indexed import CorpusError, IndexedTokens
from .index import SampleIndex, blend_num_samples, blending_indices, build_index, split_bounds

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "valid", "test")
CACHE_DIR_NAME = "index-cache"
INDEX_VERSION = 1  # bump when the index algorithm or the key changes


class GPTDataset:
    """Samples of ``max_seq_length + 1`` tokens from one split of one corpus, in PaddleNLP's shuffled order.

    ``dataset[i]`` -> int64 ``[L + 1]`` (``input_ids = x[:-1]``, ``labels = x[1:]``). Windows may span documents;
    the collator (:mod:`.collate`) turns end-of-document tokens into document masks.

    Raises :class:`CorpusError` on an item holding a token id ``>= vocab_size`` (when ``vocab_size`` is set).
    """

    def __init__(self, corpus: IndexedTokens, name: str, index: SampleIndex, seq_length: int,
                 vocab_size: int | None = None):
        self.corpus, self.name, self.index, self.seq_length = corpus, name, index, seq_length
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return len(self.index)

    def sample(self, i: int) -> tuple[np.ndarray, list[int]]:
        """Tokens of sample ``i`` (int64 ``[L + 1]``) and the sequence ids it reads, in order."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range [0, {len(self)})")
        idx = self.index
        j = int(idx.shuffle_idx[i])
        f, of = (int(v) for v in idx.sample_idx[j])
        last, ol = (int(v) for v in idx.sample_idx[j + 1])
        docs = [int(idx.doc_idx[k]) for k in range(f, last + 1)]
        if f == last:
            parts = [self.corpus.get(docs[0], of, ol - of + 1)]
        else:
            parts = [self.corpus.get(docs[0], of)]
            parts += [self.corpus.get(d) for d in docs[1:-1]]
            parts.append(self.corpus.get(docs[-1], 0, ol + 1))
        return np.concatenate(parts).astype(np.int64), docs

    def __getitem__(self, i: int) -> np.ndarray:
        tokens, docs = self.sample(i)
        if self.vocab_size is not None and tokens.size and (tokens.max() >= self.vocab_size or tokens.min() < 0):
            bad = int(tokens.max() if tokens.max() >= self.vocab_size else tokens.min())
            seq = next(d for d in docs if np.any(self.corpus.get(d) == bad))
            raise CorpusError(f"{self.corpus.token_file}: sequence {seq} holds token id {bad}, outside the model's "
                              f"vocabulary [0, {self.vocab_size}): the corpus was tokenised with another tokenizer; "
                              "preprocess it again with this model's tokenizer (tokenizer_name_or_path)")
        return tokens


class BlendableDataset:
    """``size`` samples interleaved from ``datasets`` by ``weights`` (PaddleNLP ``BlendableDataset``, the greedy
    ``build_blending_indices``). ``dataset[i]`` = ``datasets[dataset_index[i]][dataset_sample_index[i]]``."""

    def __init__(self, datasets: Sequence[GPTDataset], weights: Sequence[float], size: int,
                 indices: tuple[np.ndarray, np.ndarray] | None = None):
        self.datasets, self.weights, self.size = list(datasets), list(weights), int(size)
        self.dataset_index, self.dataset_sample_index = indices or blending_indices(self.weights, self.size)
        for k, ds in enumerate(self.datasets):
            need = int(np.count_nonzero(self.dataset_index == k))
            if need > len(ds):
                raise AssertionError(f"blend takes {need} samples of dataset {k}, which has {len(ds)}")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.size:
            raise IndexError(f"sample {i} out of range [0, {self.size})")
        return self.datasets[int(self.dataset_index[i])][int(self.dataset_sample_index[i])]


# ---- input discovery ----------------------------------------------------------------------------------------------
def data_prefixes(input_dir: str) -> tuple[list[str], list[float]]:
    """``(prefixes, weights)`` from ``input_dir`` (PaddleNLP ``get_train_data_file``).

    - ``"w1 prefix1 w2 prefix2 ..."`` (several words): that weighted list;
    - a directory: every ``<prefix>.idx`` / ``<prefix>_idx.npz`` in it (sorted), weight 1 each;
    - a prefix whose files exist (ours): that corpus alone.

    Raises ValueError naming ``input_dir`` (no corpus found, odd word count, a weight that is not a number) and
    :class:`CorpusError` for a prefix of the list whose files do not exist.
    """
    words = str(input_dir).split()
    if len(words) > 1:
        if len(words) % 2:
            raise ValueError(f"input_dir={input_dir!r}: a weighted list is pairs 'weight prefix weight prefix ...', "
                             f"got {len(words)} words")
        weights, prefixes = [], []
        for w, p in zip(words[::2], words[1::2]):
            try:
                weights.append(float(w))
            except ValueError:
                raise ValueError(f"input_dir={input_dir!r}: {w!r} should be the weight of {p!r} (a number); the "
                                 "list is 'weight prefix weight prefix ...'") from None
            prefixes.append(p)
        for p in prefixes:
            if not _has_corpus(p):
                raise CorpusError(f"input_dir lists the prefix {p!r}, but neither {p}.bin + {p}.idx nor {p}_ids.npy + "
                                  f"{p}_idx.npz exist (relative prefixes are read from {os.getcwd()}); fix the prefix "
                                  "or remove it from the list")
        return prefixes, weights
    path = words[0] if words else ""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
        prefixes = sorted({os.path.join(path, n[: -len(s)]) for n in names for s in (".idx", "_idx.npz")
                           if n.endswith(s)})
        if not prefixes:
            raise ValueError(f"input_dir={path!r} holds no corpus (<prefix>.bin + <prefix>.idx or <prefix>_ids.npy + "
                             "<prefix>_idx.npz); write one with llm/tools/preprocess/create_pretraining_data.py")
        return prefixes, [1.0] * len(prefixes)
    if path and _has_corpus(path):
        return [path], [1.0]
    raise ValueError(f"input_dir={input_dir!r} is neither a directory of token files, nor a corpus prefix, nor a "
                     "weighted list 'w1 prefix1 w2 prefix2'")


def _has_corpus(prefix: str) -> bool:
    return any(os.path.isfile(prefix + s) for s in (".idx", ".bin", "_idx.npz", "_ids.npy"))


# ---- the index cache ----------------------------------------------------------------------------------------------
def index_description(name: str, num_samples: int, seq_length: int, seed: int, split: str, bounds: tuple[int, int],
                      corpus: IndexedTokens) -> str:
    """The cache key's text: PaddleNLP's lines plus what its key misses (the split's sequence range, the token
    count and a hash of the sizes it covers), so changed data or settings never reuse an index."""
    a, b = bounds
    sizes_md5 = hashlib.md5(np.ascontiguousarray(corpus.sizes[a:b]).tobytes()).hexdigest()
    return (f"GPT Dataset\n\nDataset name {name}\nNumber of samples {num_samples}\nSequence length {seq_length}\n"
            f"Random seed {seed}\nSplit {split}\nSequences [{a}, {b}) of {len(corpus)}\n"
            f"Tokens {int(corpus.sizes[a:b].sum(dtype=np.int64))}\nSizes md5 {sizes_md5}\n"
            f"Index version {INDEX_VERSION}\n")


_ARRAYS = ("doc_idx", "sample_idx", "shuffle_idx")


def _cache_files(directory: str, key: str) -> dict[str, str]:
    files = {a: os.path.join(directory, f"{key}_{a}.npy") for a in _ARRAYS}
    files["dsc"] = os.path.join(directory, f"{key}.dsc")
    return files


def _save_atomic(path: str, write: Callable) -> None:
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def cached_index(desc: str, dirs: Sequence[str], build: Callable[[], SampleIndex]) -> tuple[SampleIndex, str, bool]:
    """Load the index keyed by ``md5(desc)`` from the first of ``dirs`` holding it, else ``build()`` it and write it
    into the last of ``dirs`` (the ``.dsc`` last, so a half-written cache is never found). Returns ``(index,
    directory, built)``. Raises ValueError naming the directory and ``data_cache`` when it cannot be written."""
    key = hashlib.md5(desc.encode("utf-8")).hexdigest()
    for d in dirs:
        files = _cache_files(d, key)
        if all(os.path.isfile(f) for f in files.values()):
            arrays = [np.load(files[a], mmap_mode="r", allow_pickle=False) for a in _ARRAYS]
            return SampleIndex(*arrays), d, False
    index = build()
    d = dirs[-1]
    files = _cache_files(d, key)
    try:
        os.makedirs(d, exist_ok=True)
        for a in _ARRAYS:
            _save_atomic(files[a], lambda f, arr=getattr(index, a): np.save(f, arr, allow_pickle=False))
        _save_atomic(files["dsc"], lambda f: f.write(desc.encode("utf-8")))
    except OSError as e:
        raise ValueError(f"cannot write the index cache in {d} ({e.strerror or e}): set data_cache to a writable "
                         "directory") from None
    return index, d, True


# ---- building the splits -------------------------------------------------------------------------------------------
def _builder_then_all(work: Callable[[], object], share_folder: bool):
    """Run ``work`` on the builder rank first (local rank 0 of each node; global rank 0 with ``share_folder``), then on
    every other rank (which then finds the cache). One process: just ``work()``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return work()
    builder = dist.get_rank() == 0 if share_folder else int(os.environ.get("LOCAL_RANK", dist.get_rank())) == 0
    ok, result, error = 1, None, None
    if builder:
        try:
            result = work()
        except Exception as e:  # noqa: BLE001 - re-raised below, after the other ranks heard of it
            ok, error = 0, e
    import torch

    flag = torch.tensor([ok], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if error is not None:
        raise error
    if int(flag.item()) == 0:
        raise ValueError("building the pretraining index failed on another rank (its error is printed there)")
    return result if builder else work()


def build_split_dataset(corpus: IndexedTokens, name: str, bounds: tuple[int, int], num_samples: int,
                        seq_length: int, seed: int, split: str, data_cache: str | None = None,
                        vocab_size: int | None = None) -> GPTDataset:
    """One split's :class:`GPTDataset`, its index loaded from or written to the cache (``<dir of prefix>/index-cache``,
    then ``data_cache``; built into ``data_cache`` when given). Raises ValueError when the split's sequences hold
    fewer than ``seq_length + 1`` tokens."""
    a, b = bounds
    documents = np.arange(a, b, dtype=np.int32)
    tokens = int(corpus.sizes[a:b].sum(dtype=np.int64))
    if tokens < seq_length + 1:
        raise ValueError(f"the {name} split of {corpus.prefix} (sequences [{a}, {b}) of {len(corpus)}, split="
                         f"{split!r}) holds {tokens} tokens, fewer than one window of max_seq_length + 1 = "
                         f"{seq_length + 1}: lower max_seq_length, give this split a larger share, or add data")
    desc = index_description(name, num_samples, seq_length, seed, split, bounds, corpus)
    dirs = [os.path.join(os.path.dirname(os.path.abspath(corpus.prefix)), CACHE_DIR_NAME)]
    if data_cache:
        dirs.append(data_cache)
    index, where, built = cached_index(desc, dirs, lambda: build_index(corpus.sizes, documents, seq_length,
                                                                       num_samples, seed))
    logger.info("%s %s: %d samples of %d tokens (%s index in %s)", corpus.prefix, name, len(index), seq_length + 1,
                "built" if built else "cached", where)
    return GPTDataset(corpus, name, index, seq_length, vocab_size)


def build_train_valid_test_datasets(input_dir: str, split: str, seq_length: int, num_samples: Sequence[int],
                                    seed: int, data_cache: str | None = None, share_folder: bool = False,
                                    vocab_size: int | None = None, tokenizer_vocab_size: int | None = None):
    """``(train, valid, test)`` datasets (None for a split with no samples requested or no sequences).

    ``num_samples``: the three sample counts (``run_pretrain``: train = batch x data ranks x max_steps x
    accumulation, and the eval / test counts). Several prefixes blend by weight, each asked for
    ``ceil(n * w * 1.005) + 20`` samples, the blend holding exactly ``n``.

    Raises ValueError / :class:`CorpusError` naming the file or key and the fix: a requested split that is empty
    (e.g. ``split`` leaves no training sequence), a split shorter than one window, bad or missing files, token ids
    outside ``vocab_size`` (the model's), a corpus whose recorded vocabulary is not ``tokenizer_vocab_size``.
    """
    if data_cache:
        os.makedirs(data_cache, exist_ok=True)
    prefixes, weights = data_prefixes(input_dir)
    corpora = [IndexedTokens(p) for p in prefixes]
    if tokenizer_vocab_size is not None:
        for c in corpora:
            c.check_vocab(tokenizer_vocab_size)
    if len(corpora) == 1:
        per_dataset = [[n] for n in num_samples]
        norm = [1.0]
    else:
        norm, _ = blend_num_samples(weights, 1)
        per_dataset = [blend_num_samples(weights, n)[1] for n in num_samples]

    def work():
        out = []
        for s, name in enumerate(SPLIT_NAMES):
            n = int(num_samples[s])
            if n <= 0:
                out.append(None)
                continue
            parts = []
            for k, corpus in enumerate(corpora):
                bounds = split_bounds(split, len(corpus))
                lo, hi = bounds[s], bounds[s + 1]
                if hi <= lo:
                    raise ValueError(f"split={split!r} leaves the {name} split of {corpus.prefix} empty ({len(corpus)} "
                                     f"sequences; split bounds {bounds}) but {n} {name} samples are needed: give "
                                     f"the {name} split a larger share"
                                     + (" or set do_eval false" if s == 1 else " or set do_predict false" if s == 2
                                        else " (the first number)") + ", or add data")
                parts.append(build_split_dataset(corpus, name, (lo, hi), int(per_dataset[s][k]), seq_length, seed,
                                                 split, data_cache, vocab_size))
            out.append(parts[0] if len(parts) == 1 else BlendableDataset(parts, norm, n))
        return out

    return tuple(_builder_then_all(work, share_folder))
