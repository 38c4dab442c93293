"""Train the tiny ERNIE-3.5-SE preset's SentencePiece BPE tokenizer on the bundled data, deterministically.

Writes PaddleNLP's ``ernie-tokenizer/`` layout (``sentencepiece.bpe.model``, ``tokenizer_config.json``,
``special_tokens_map.json``) into ``paddlenlp_ext/transformers/ernie35/ernie-tokenizer/`` (the directory the
``ernie/tiny-random-ernie`` and ``baidu/ernie-3.5-se-3b`` presets load). ERNIE's real 32,000-piece model is not
available offline; this one has the same kind (BPE with byte fallback, ``<unk>`` = 0, ``<s>`` = 1, ``</s>`` = 2,
no pad piece) and 4,096 pieces.

Text: every ``src``/``tgt`` turn of ``data/sft/train.json`` and every prompt/response of
``data/preference/train.jsonl`` (chatterbot-corpus, BSD-3-Clause; see data/README.md), in file order. Training is
single-threaded with no sampling or shuffling, so the same text gives the same model, byte for byte.

Usage: ``python data/build_ernie_tokenizer.py [--data data] [--out DIR] [--vocab_size 4096]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "paddlenlp_ext", "transformers", "ernie35", "ernie-tokenizer")
VOCAB_SIZE = 4096


def training_text(data_dir: str) -> list[str]:
    """The turns of the SFT and preference train splits, in file order (one string per turn)."""
    texts = []
    with open(os.path.join(data_dir, "sft", "train.json"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            texts += list(rec["src"]) + list(rec["tgt"])
    with open(os.path.join(data_dir, "preference", "train.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            texts += list(rec["src"]) + list(rec["tgt"]) + list(rec["response"])
    return [t for t in texts if t.strip()]


def train(texts: list[str], vocab_size: int = VOCAB_SIZE) -> bytes:
    """Serialized SentencePiece BPE model (Llama-style normalisation: none, dummy prefix, whitespace kept)."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, model_type="bpe", vocab_size=vocab_size,
        character_coverage=1.0, byte_fallback=True, split_digits=True, num_threads=1,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, shuffle_input_sentence=False, input_sentence_size=0, minloglevel=2)
    return model.getvalue()


def write(out_dir: str, model: bytes) -> None:
    """The three files of PaddleNLP's ``ernie-tokenizer/`` directory, each written atomically."""
    os.makedirs(out_dir, exist_ok=True)
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "model_max_length": 2048, "pad_token": "<unk>", "padding_side": "left",
              "tokenizer_class": "Ernie35Tokenizer", "unk_token": "<unk>"}
    specials = {name: {"content": tok, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
                for name, tok in (("bos_token", "<s>"), ("eos_token", "</s>"), ("unk_token", "<unk>"))}
    files = {"sentencepiece.bpe.model": model,
             "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode(),
             "special_tokens_map.json": (json.dumps(specials, indent=2) + "\n").encode()}
    for name, data in files.items():
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(out_dir, name))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.join(ROOT, "data"), help="the bundled data directory")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: the presets' tokenizer)")
    parser.add_argument("--vocab_size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    texts = training_text(args.data)
    write(args.out, train(texts, args.vocab_size))
    print(f"{args.out}: {args.vocab_size} pieces from {len(texts)} turns")


if __name__ == "__main__":
    main()
