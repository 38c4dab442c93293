"""Token files of pretraining corpora, memory-mapped: both on-disk formats PaddleNLP and Megatron-LM write.

- ``<prefix>.bin`` + ``<prefix>.idx`` (PaddleNLP ``paddlenlp/data/indexed_dataset.py`` ``MMapIndexedDataset``,
  Megatron-LM ``megatron/core/datasets/indexed_dataset.py``; byte layout in docs/pretraining.md): the ``.bin`` is
  the headerless concatenation of every sequence's tokens; the ``.idx`` holds magic ``MMIDIDX\\0\\0``, version 1,
  a dtype code, the sequence and document counts, int32 ``sizes``, int64 byte ``pointers`` and int64 ``doc_idx``.
- ``<prefix>_ids.npy`` + ``<prefix>_idx.npz`` (PaddleNLP's ERNIE tool): all tokens in one ``.npy``; the ``.npz``
  holds int32 ``lens`` (tokens per sequence) and int64 ``docs`` (cumulative sequence count per document).

When both exist the ``.npy``/``.npz`` pair is read (PaddleNLP's ``make_dataset`` order). Nothing is read whole:
the token file and the ``.idx`` arrays are ``np.memmap``/``np.load(mmap_mode="r")`` views.

Ours: an optional ``<prefix>.meta.json`` written by ``llm/tools/preprocess/create_pretraining_data.py`` records the
tokenizer's vocabulary size and end-of-document id, so mismatched tokenizer and data are refused.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from typing import Sequence

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, sequence count, document count
#: dtype codes of PaddleNLP's ``indexed_dataset.dtypes`` (Megatron's ``DType`` has 1-8, same values)
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
               8: np.uint16, 9: np.uint32, 10: np.uint64}
CODE_OF = {np.dtype(v): k for k, v in DTYPE_CODES.items()}
META_SUFFIX = ".meta.json"


class CorpusError(ValueError):
    """A token file or its index is missing, truncated or inconsistent; the message names the file and the fix."""


def token_dtype(vocab_size: int) -> np.dtype:
    """Narrowest safe token dtype for ids ``0 .. vocab_size - 1``: uint16 when they all fit, else int32.

    ``vocab_size`` must count added tokens (``len(tokenizer)``). PaddleNLP's tool looks at the base vocabulary
    only (``tokenizer.vocab_size < 65535``), so an added token id past 65535 wraps silently in uint16.
    """
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be > 0, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.int32)


def data_files(prefix: str) -> tuple[str, str, str]:
    """``(format, token file, index file)`` of ``prefix``: ``"npy"`` when ``<prefix>_ids.npy`` and
    ``<prefix>_idx.npz`` both exist, else ``"mmap"`` (``.bin`` / ``.idx``)."""
    ids, npz = prefix + "_ids.npy", prefix + "_idx.npz"
    if os.path.isfile(ids) and os.path.isfile(npz):
        return "npy", ids, npz
    return "mmap", prefix + ".bin", prefix + ".idx"


class IndexedTokens:
    """One corpus prefix: ``sizes`` (int32 ``[N]``, tokens per stored sequence), ``doc_idx`` (int64 ``[D+1]``,
    first sequence of each document), and token slices of any sequence.

    ``get(i, offset=0, length=None)`` -> the tokens ``[offset, offset+length)`` of sequence ``i`` as a read-only
    array in the file's dtype (PaddleNLP returns ``(tokens, mask)``; the loss-mask sidecar is not read here).

    Raises :class:`CorpusError` naming the file when a file is missing, the ``.idx`` header or arrays are
    truncated or of another format, or the sizes do not sum to the token file's length.
    """

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.format, self.token_file, self.index_file = data_files(prefix)
        if self.format == "npy":
            self._open_npy()
        else:
            self._open_mmap()
        self.num_tokens = int(self.sizes.sum(dtype=np.int64))
        self.meta = read_meta(prefix)

    # ---- opening -------------------------------------------------------------------------------------------
    def _missing(self) -> CorpusError:
        have = [f for f in (self.token_file, self.index_file) if os.path.isfile(f)]
        need = [f for f in (self.token_file, self.index_file) if not os.path.isfile(f)]
        return CorpusError(f"{need[0]} is missing ({'found ' + have[0] if have else 'no token file at all'} for "
                           f"prefix {self.prefix!r}): a corpus is <prefix>.bin + <prefix>.idx or <prefix>_ids.npy + "
                           f"<prefix>_idx.npz; rerun llm/tools/preprocess/create_pretraining_data.py --output_prefix "
                           f"{self.prefix}")

    def _open_mmap(self) -> None:
        if not (os.path.isfile(self.token_file) and os.path.isfile(self.index_file)):
            raise self._missing()
        idx = self.index_file
        size = os.path.getsize(idx)
        with open(idx, "rb") as f:
            head = f.read(HEADER_BYTES)
        if len(head) < 9 and MAGIC.startswith(head):
            raise CorpusError(f"{idx} is truncated: {size} bytes, shorter than its {HEADER_BYTES}-byte header; "
                              "rebuild it with llm/tools/preprocess/create_pretraining_data.py")
        if head[:9] != MAGIC:
            raise CorpusError(f"{idx} is not a MMIDIDX index (magic {head[:9]!r}, expected {MAGIC!r}): PaddleNLP's "
                              "lazy 'TNTIDX' format and other files are not read; rebuild it with "
                              "llm/tools/preprocess/create_pretraining_data.py --data_impl mmap")
        if len(head) < HEADER_BYTES:
            raise CorpusError(f"{idx} is truncated: {size} bytes, shorter than its {HEADER_BYTES}-byte header; "
                              "rebuild it with llm/tools/preprocess/create_pretraining_data.py")
        version, code, n, d = struct.unpack("<QBQQ", head[9:])
        if version != VERSION:
            raise CorpusError(f"{idx}: index version {version}, only version {VERSION} is known")
        if code not in DTYPE_CODES:
            raise CorpusError(f"{idx}: unknown token dtype code {code} (known: {sorted(DTYPE_CODES)})")
        self.dtype = np.dtype(DTYPE_CODES[code])
        need = HEADER_BYTES + 4 * n + 8 * n + 8 * d
        if size < need:
            raise CorpusError(f"{idx} is truncated: {size} bytes, its header announces {n} sequences and {d - 1} "
                              f"documents ({need} bytes); rebuild it with "
                              "llm/tools/preprocess/create_pretraining_data.py")
        mm = np.memmap(idx, mode="r", dtype=np.uint8)
        self.sizes = np.frombuffer(mm, dtype=np.int32, count=n, offset=HEADER_BYTES)
        self.pointers = np.frombuffer(mm, dtype=np.int64, count=n, offset=HEADER_BYTES + 4 * n)
        self.doc_idx = np.frombuffer(mm, dtype=np.int64, count=d, offset=HEADER_BYTES + 12 * n)
        bin_bytes = os.path.getsize(self.token_file)
        want = int(self.sizes.sum(dtype=np.int64)) * self.dtype.itemsize
        if bin_bytes != want:
            raise CorpusError(f"{self.token_file} holds {bin_bytes} bytes but {idx} lists {n} sequences of "
                              f"{want // self.dtype.itemsize} {self.dtype.name} tokens ({want} bytes): "
                              f"{'the token file is truncated' if bin_bytes < want else 'the index does not match'}"
                              "; rebuild both with llm/tools/preprocess/create_pretraining_data.py")
        if n and (self.pointers[0] != 0 or int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype.itemsize
                  != bin_bytes):
            raise CorpusError(f"{idx}: the byte pointers do not match the sizes (first {int(self.pointers[0])}, "
                              f"last {int(self.pointers[-1])}); rebuild it")
        self._check_doc_idx()
        self.tokens = (np.memmap(self.token_file, mode="r", dtype=self.dtype) if bin_bytes
                       else np.zeros(0, self.dtype))
        self._starts = self.pointers // self.dtype.itemsize  # element offsets

    def _open_npy(self) -> None:
        try:
            self.tokens = np.load(self.token_file, mmap_mode="r")
        except ValueError as e:  # a header numpy cannot parse, or fewer bytes than the header announces
            raise CorpusError(f"{self.token_file} is not a readable .npy file ({e}): the token file is truncated or "
                              "damaged; rebuild it") from None
        if self.tokens.ndim != 1:
            raise CorpusError(f"{self.token_file}: token array must be 1-D, got shape {list(self.tokens.shape)}")
        self.dtype = self.tokens.dtype
        try:
            with np.load(self.index_file) as z:
                if "lens" not in z or "docs" not in z:
                    raise CorpusError(f"{self.index_file} must hold the arrays 'lens' and 'docs' (PaddleNLP's "
                                      f"_idx.npz), it has {sorted(z.files)}")
                self.sizes = np.asarray(z["lens"]).astype(np.int32, copy=False)
                self.doc_idx = np.asarray(z["docs"]).astype(np.int64, copy=False)
        except (OSError, ValueError, EOFError) as e:
            if isinstance(e, CorpusError):
                raise
            raise CorpusError(f"{self.index_file} is not a readable .npz file ({e}); rebuild it") from None
        total = int(self.sizes.sum(dtype=np.int64))
        if total != self.tokens.shape[0]:
            raise CorpusError(f"{self.index_file}: 'lens' sums to {total} tokens but {self.token_file} holds "
                              f"{self.tokens.shape[0]}: {'the token file is truncated' if total > self.tokens.shape[0] else 'the index does not match'}"
                              "; rebuild both")
        self._starts = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)[:-1]]) if len(self.sizes) else \
            np.zeros(0, np.int64)
        self._check_doc_idx()

    def _check_doc_idx(self) -> None:
        d, n = self.doc_idx, len(self.sizes)
        if len(d) == 0 or d[0] != 0 or d[-1] != n or (len(d) > 1 and np.any(np.diff(d) < 0)):
            raise CorpusError(f"{self.index_file}: the document index must rise from 0 to the sequence count {n}, "
                              f"got {len(d)} entries from {int(d[0]) if len(d) else None} to "
                              f"{int(d[-1]) if len(d) else None}; rebuild it")
        if np.any(self.sizes < 0):
            raise CorpusError(f"{self.index_file}: negative sequence sizes; rebuild it")

    # ---- reading -------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sizes)

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of sequence ``i`` (to its end when ``length`` is None)."""
        size = int(self.sizes[i])
        length = size - offset if length is None else length
        start = int(self._starts[i]) + offset
        return self.tokens[start: start + length]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.get(i)

    def check_vocab(self, tokenizer_vocab_size: int) -> None:
        """Refuse data preprocessed with another tokenizer: the vocabulary size recorded in ``.meta.json`` (when
        present; PaddleNLP's and Megatron-LM's files have none) must equal ``tokenizer_vocab_size``
        (``len(tokenizer)``). Raises :class:`CorpusError` naming the file and the fix."""
        recorded = (self.meta or {}).get("vocab_size")
        if recorded is not None and int(recorded) != int(tokenizer_vocab_size):
            raise CorpusError(f"{self.prefix + META_SUFFIX}: the corpus was tokenised with a vocabulary of {recorded} "
                              f"tokens ({self.meta.get('tokenizer', '?')}), the tokenizer of this run has "
                              f"{tokenizer_vocab_size}: tokenizer and data do not match; point tokenizer_name_or_path "
                              "at the tokenizer used for preprocessing, or preprocess the corpus again with this one")


def read_meta(prefix: str) -> dict | None:
    """``<prefix>.meta.json`` as a dict, or None when absent (files written by PaddleNLP or Megatron-LM)."""
    path = prefix + META_SUFFIX
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CorpusError(f"{path} is not valid JSON ({e}); delete it or rerun the preprocessing") from None


# ---- writing ---------------------------------------------------------------------------------------------------
def _atomic_path(final: str) -> str:
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(final) + ".", suffix=".tmp", dir=os.path.dirname(final) or ".")
    os.close(fd)
    return tmp


def write_index(path: str, sizes: Sequence[int], doc_idx: Sequence[int], dtype) -> None:
    """Write a MMIDIDX ``.idx`` for sequences of ``sizes`` tokens of ``dtype`` (byte layout of PaddleNLP's
    ``MMapIndexedDataset.Index.writer`` and Megatron-LM's ``_IndexWriter``). Not atomic by itself."""
    dtype = np.dtype(dtype)
    sizes = np.asarray(sizes, dtype=np.int32)
    doc_idx = np.asarray(doc_idx, dtype=np.int64)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<QBQQ", VERSION, CODE_OF[dtype], len(sizes), len(doc_idx)))
        f.write(sizes.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(doc_idx.tobytes(order="C"))


class IndexedTokensWriter:
    """Streams documents into ``<prefix>.bin`` + ``<prefix>.idx`` (or ``_ids.npy`` + ``_idx.npz`` with
    ``data_impl="npy"``) through temporary files renamed into place by :meth:`finalize`, so a killed run leaves
    no half-written corpus; :meth:`abort` removes the temporary files.

    ``add_document(sequences)``: one document of one or more token sequences (one per sentence with
    ``--split_sentences``), like PaddleNLP's ``add_item`` calls followed by ``end_document``.
    """

    def __init__(self, prefix: str, dtype, data_impl: str = "mmap", meta: dict | None = None):
        if data_impl not in ("mmap", "npy"):
            raise ValueError(f"data_impl must be 'mmap' (.bin/.idx) or 'npy' (_ids.npy/_idx.npz), got {data_impl!r}")
        self.prefix, self.dtype, self.data_impl, self.meta = prefix, np.dtype(dtype), data_impl, meta
        os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
        self.token_file = prefix + (".bin" if data_impl == "mmap" else "_ids.npy")
        self.index_file = prefix + (".idx" if data_impl == "mmap" else "_idx.npz")
        self._tmp_bin = _atomic_path(prefix + ".bin")  # raw tokens; the .npy gets a header at finalize
        self._f = open(self._tmp_bin, "wb")
        self.sizes: list[int] = []
        self.doc_idx: list[int] = [0]
        self.max_id = -1

    def add_document(self, sequences: Sequence[Sequence[int]]) -> None:
        seqs = [np.asarray(s, dtype=np.int64) for s in sequences if len(s)]
        if not seqs:
            return
        for s in seqs:
            if s.min() < 0 or s.max() > np.iinfo(self.dtype).max:
                raise ValueError(f"token id {int(s.max()) if s.max() > 0 else int(s.min())} does not fit "
                                 f"{self.dtype.name}; write with a wider dtype")
            self.max_id = max(self.max_id, int(s.max()))
            self._f.write(s.astype(self.dtype).tobytes())
            self.sizes.append(len(s))
        self.doc_idx.append(len(self.sizes))

    def finalize(self) -> None:
        self._f.close()
        tmps = [self._tmp_bin]
        try:
            tmp_idx = _atomic_path(self.index_file)
            tmps.append(tmp_idx)
            if self.data_impl == "mmap":
                write_index(tmp_idx, self.sizes, self.doc_idx, self.dtype)
                tmp_tokens = self._tmp_bin
            else:
                tokens = np.fromfile(self._tmp_bin, dtype=self.dtype)
                tmp_tokens = _atomic_path(self.token_file)
                tmps.append(tmp_tokens)
                with open(tmp_tokens, "wb") as f:
                    np.save(f, tokens)
                with open(tmp_idx, "wb") as f:
                    np.savez(f, lens=np.asarray(self.sizes, np.int32), docs=np.asarray(self.doc_idx, np.int64))
            meta_tmp = None
            if self.meta is not None:
                meta_tmp = _atomic_path(self.prefix + META_SUFFIX)
                tmps.append(meta_tmp)
                with open(meta_tmp, "w", encoding="utf-8") as f:
                    json.dump({**self.meta, "dtype": self.dtype.name, "sequences": len(self.sizes),
                               "documents": len(self.doc_idx) - 1, "tokens": int(sum(self.sizes)),
                               "max_token_id": self.max_id}, f, indent=1)
            # the index last: a reader never sees an index without its complete token file
            for tmp, final in ((tmp_tokens, self.token_file), (meta_tmp, self.prefix + META_SUFFIX),
                               (tmp_idx, self.index_file)):
                if tmp is not None:
                    os.chmod(tmp, 0o644)
                    os.replace(tmp, final)
        finally:
            for t in tmps:
                if os.path.exists(t):
                    os.remove(t)

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        if os.path.exists(self._tmp_bin):
            os.remove(self._tmp_bin)


def write_corpus(prefix: str, documents: Sequence[Sequence[Sequence[int]]], dtype=np.uint16,
                 data_impl: str = "mmap", meta: dict | None = None) -> str:
    """Write ``documents`` (each a list of token sequences) as a corpus; returns ``prefix``. For tests and small
    corpora; the preprocessing tool streams through :class:`IndexedTokensWriter`."""
    w = IndexedTokensWriter(prefix, dtype, data_impl, meta)
    try:
        for doc in documents:
            w.add_document(doc)
    except BaseException:
        w.abort()
        raise
    w.finalize()
    return prefix
