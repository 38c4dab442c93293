"""Build the bundled pretraining corpus ``data/pretrain/`` from Botchan (Project Gutenberg, public domain).

Source: ``test/botchan.txt`` of the sentencepiece 0.2.1 source distribution on PyPI (the English translation of
Natsume Soseki's *Botchan* by Yasotaro Morri, Project Gutenberg EBook #8868; public domain in the USA). The
Project Gutenberg header and licence footer are removed; the text between them is cut into documents of whole
lines of at least ``--doc_chars`` characters ending a sentence, never across a chapter.

Outputs: ``data/pretrain/botchan.jsonl`` (``{"text": ...}`` per document) and, tokenised with the SmolLM2 tokenizer
by ``llm/tools/preprocess/create_pretraining_data.py --append_eos``, ``data/pretrain/botchan.bin`` / ``.idx`` /
``.meta.json``. Deterministic.

Usage: ``python data/build_pretrain_data.py [--botchan path/to/botchan.txt]`` (without it the sdist is fetched with
``pip download --no-binary :all: --no-deps sentencepiece==0.2.1``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST = "sentencepiece==0.2.1"
START, END = "*** START OF THIS PROJECT GUTENBERG EBOOK", "*** END OF THIS PROJECT GUTENBERG EBOOK"


def fetch_botchan(workdir: str) -> str:
    """Download the sentencepiece sdist with pip and extract ``test/botchan.txt``; returns its path."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", SDIST, "-d",
                    workdir], check=True, capture_output=True)
    archive = next(os.path.join(workdir, f) for f in os.listdir(workdir) if f.endswith(".tar.gz"))
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("test/botchan.txt"))
        member.name = "botchan.txt"
        tar.extract(member, workdir, filter="data")
    return os.path.join(workdir, "botchan.txt")


def documents(text: str, doc_chars: int) -> list[str]:
    """The book between the Gutenberg markers, cut into documents (see the module docstring)."""
    lines = text.lstrip("\ufeff").splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(START)) + 1
    end = next(i for i, l in enumerate(lines) if l.startswith(END))
    body = [l.rstrip() for l in lines[start:end] if not l.startswith("Produced by")]
    docs, cur = [], []
    for line in body:
        if re.match(r"^CHAPTER [IVXL]+\.?$", line.strip()) and cur:
            docs.append(cur)
            cur = []
        if line.strip():
            cur.append(line.strip())
        if sum(len(c) + 1 for c in cur) >= doc_chars and re.search(r"[.!?][\"']?$", line.strip()):
            docs.append(cur)
            cur = []
    if cur:
        docs.append(cur)
    return [" ".join(d) for d in docs]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--botchan", default=None, help="botchan.txt (default: fetched from the sentencepiece sdist)")
    p.add_argument("--out", default=os.path.join(ROOT, "data", "pretrain"))
    p.add_argument("--doc_chars", type=int, default=1500)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.botchan or fetch_botchan(tmp)
        with open(path, encoding="utf-8") as f:
            docs = documents(f.read(), args.doc_chars)
    os.makedirs(args.out, exist_ok=True)
    jsonl = os.path.join(args.out, "botchan.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    print(f"{len(docs)} documents -> {jsonl}", file=sys.stderr)
    subprocess.run([sys.executable, os.path.join(ROOT, "llm", "tools", "preprocess", "create_pretraining_data.py"),
                    "--model_name_or_path", "HuggingFaceTB/SmolLM2-135M-Instruct", "--input_path", jsonl,
                    "--output_prefix", os.path.join(args.out, "botchan"), "--append_eos"], check=True)


if __name__ == "__main__":
    main()
