"""Tokenise jsonl documents into a pretraining corpus: ``<prefix>.bin`` + ``<prefix>.idx`` (PaddleNLP's and
Megatron-LM's format) or, with ``--data_impl npy``, ``<prefix>_ids.npy`` + ``<prefix>_idx.npz`` (PaddleNLP's ERNIE
format), plus ``<prefix>.meta.json`` (ours: vocabulary size, eos id and tokenizer, checked by ``run_pretrain.py``).

PaddleNLP ``llm/tools/preprocess/create_pretraining_data.py`` flags and per-document rules: each line's
``--json_key`` text, runs of one character longer than ``--max_repeated_len`` collapsed to one copy, tokenised
without special tokens, ``--append_eos`` adds the tokenizer's eos to the last sentence, empty documents skipped.
Differences: the token dtype counts added tokens (``len(tokenizer)``: uint16 only when every id fits); the output is
written to temporary files renamed into place at the end, so a killed run leaves no half-written corpus;
``--split_sentences`` splits on newlines with ``--chinese`` and after ``.``/``!``/``?`` otherwise (PaddleNLP uses
NLTK punkt); a line that is not JSON or lacks the key is an error naming ``file:line``.

Usage (``paddlenlp-create-pretraining-data`` is the same command):
``python llm/tools/preprocess/create_pretraining_data.py --model_name_or_path <model or tokenizer dir>
--input_path docs.jsonl --output_prefix data/mycorpus --append_eos --workers 2``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys


def get_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model_name_or_path", required=True,
                   help="Model or tokenizer directory (or the embedded HuggingFaceTB/SmolLM2-135M-Instruct).")
    p.add_argument("--tokenizer_name_or_path", default=None, help="Tokenizer, when not the model's (ours).")
    p.add_argument("--input_path", required=True, help="A .jsonl file, or a directory searched recursively for "
                                                       "*.jsonl (and *.jsonl.zst / *.zst with zstandard installed).")
    p.add_argument("--output_prefix", required=True, help="Writes <prefix>.bin and <prefix>.idx.")
    p.add_argument("--data_format", default="text", help="Accepted for PaddleNLP compatibility; input is jsonl.")
    p.add_argument("--json_key", default="text", help="Key of the document text in each JSON line.")
    p.add_argument("--split_sentences", action="store_true", help="Store each sentence as its own sequence.")
    p.add_argument("--chinese", action="store_true", help="With --split_sentences: split on newlines.")
    p.add_argument("--data_impl", default="mmap", choices=["mmap", "npy"],
                   help="mmap: <prefix>.bin/.idx (PaddleNLP, Megatron-LM); npy: <prefix>_ids.npy/_idx.npz.")
    p.add_argument("--append_eos", action="store_true", help="Append the tokenizer's eos to each document.")
    p.add_argument("--log_interval", type=int, default=100, help="Progress update every N documents.")
    p.add_argument("--workers", type=int, default=1, help="Tokenising processes.")
    p.add_argument("--max_doc_num", type=int, default=sys.maxsize, help="Stop after this many input lines.")
    p.add_argument("--max_repeated_len", type=int, default=100,
                   help="Collapse runs of one character longer than this to a single copy.")
    args = p.parse_args(argv)
    if args.workers < 1 or args.log_interval < 1 or args.max_repeated_len < 1:
        p.error("--workers, --log_interval and --max_repeated_len must be >= 1")
    return args


def main(argv=None) -> dict:
    """Write the corpus; returns ``{"documents", "sequences", "tokens", "dtype", "files"}``."""
    args = get_args(argv)
    from tqdm import tqdm

    from paddlenlp_ext.datasets.pretraining import IndexedTokensWriter, token_dtype
    from paddlenlp_ext.datasets.pretraining.preprocess import encode, init_worker, input_files, read_lines
    from paddlenlp_ext.transformers import AutoTokenizer

    tok_path = args.tokenizer_name_or_path or args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(tok_path)
    if args.append_eos and tokenizer.eos_token_id is None:
        raise ValueError(f"--append_eos: the tokenizer of {tok_path} has no eos_token")
    vocab = max(len(tokenizer), int(getattr(tokenizer, "vocab_size", 0) or 0))
    dtype = token_dtype(vocab)
    files = input_files(args.input_path)
    split = ("newline" if args.chinese else "sentence") if args.split_sentences else None
    init = (tok_path, args.json_key, split, args.append_eos, args.max_repeated_len)
    meta = {"tokenizer": tok_path, "vocab_size": vocab, "eos_token_id": tokenizer.eos_token_id if args.append_eos
            else None, "json_key": args.json_key, "split_sentences": args.split_sentences}
    writer = IndexedTokensWriter(args.output_prefix, dtype, args.data_impl, meta)
    lines = read_lines(files, args.max_doc_num)
    pool = None
    try:
        if args.workers > 1:
            pool = multiprocessing.get_context("spawn").Pool(args.workers, init_worker, init)
            results = pool.imap(encode, lines, chunksize=64)
        else:
            init_worker(*init)
            results = map(encode, lines)
        bar = tqdm(results, unit=" docs", miniters=args.log_interval, file=sys.stderr, disable=None)
        for path, lineno, seqs, error in bar:
            if error:
                raise ValueError(f"{path}:{lineno}: {error}")
            writer.add_document(seqs)
        bar.close()
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
    finally:
        if pool is not None:
            pool.terminate()
    out = {"documents": len(writer.doc_idx) - 1, "sequences": len(writer.sizes), "tokens": int(sum(writer.sizes)),
           "dtype": dtype.name, "files": [writer.token_file, writer.index_file]}
    print(f"wrote {out['documents']} documents, {out['tokens']} {out['dtype']} tokens to {writer.token_file} and "
          f"{writer.index_file}", file=sys.stderr)
    return out


def cli() -> None:
    """The ``paddlenlp-create-pretraining-data`` command (and ``python
    llm/tools/preprocess/create_pretraining_data.py``): :func:`main` on ``sys.argv``; bad input is one ``error:``
    line and exit 2, Ctrl-C exit 130 (nothing written)."""
    try:
        main()
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("interrupted: nothing was written (the output files are renamed into place only when complete)",
              file=sys.stderr)
        raise SystemExit(130) from None
