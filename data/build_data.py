"""Build the bundled SFT and constructed-preference data from the ``chatterbot-corpus`` package.

Source data: chatterbot-corpus 1.3.3 (PyPI, https://github.com/gunthercox/chatterbot-corpus), English
``chatterbot_corpus/data/english/*.yml``, BSD-3-Clause, Copyright (c) Gunther Cox. The text is
redistributed here in converted form under that licence; see data/README.md.

Outputs (jsonl, one object per line, UTF-8), deterministic for a given package version and seed:

- ``<out>/sft/train.json``, ``<out>/sft/dev.json``: PaddleNLP SFT records ``{"src": [user turns],
  "tgt": [answers]}`` (multi-turn conversations kept; an unpaired final turn is dropped); exact duplicate
  conversations removed; seeded 90/10 split.
- ``<out>/preference/train.jsonl``, ``<out>/preference/dev.jsonl``: CONSTRUCTED pairs in PaddleNLP's
  preference format ``{"src": [prompt], "tgt": [], "response": [a, b], "sort": [s_a, s_b],
  "construction": ...}`` built from the single-turn conversations: chosen = the human reply to the prompt,
  rejected = a human reply written for a conversation of another topic file (offline_assets.md (c)).
  The order of the two responses is random; ``sort`` marks the chosen one with 1 and the rejected with 0.
  These are not human preference judgements.

Usage: ``python data/build_data.py [--out data] [--seed 0]`` (needs ``pip install chatterbot-corpus==1.3.3``).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import random

import yaml

CONSTRUCTION = "mismatched-reply (rejected = human reply written for another topic; chatterbot-corpus)"
DEV_FRACTION = 0.1


def corpus_dir(language: str = "english") -> str:
    """The package's data directory, found without importing the package."""
    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None:
        raise SystemExit("chatterbot-corpus is not installed: pip install chatterbot-corpus==1.3.3")
    return os.path.join(list(spec.submodule_search_locations)[0], "data", language)


def conversations(language: str = "english"):
    """Unique conversations as ``{"src", "tgt", "topic"}``, in file then row order."""
    out, seen = [], set()
    for path in sorted(glob.glob(os.path.join(corpus_dir(language), "*.yml"))):
        topic = os.path.splitext(os.path.basename(path))[0]
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        for conv in doc.get("conversations", []) or []:
            turns = [str(x).strip() for x in conv]
            if len(turns) < 2 or any(not t for t in turns) or tuple(turns) in seen:
                continue
            seen.add(tuple(turns))
            n = len(turns) // 2 * 2
            out.append({"src": turns[0:n:2], "tgt": turns[1:n:2], "topic": topic})
    return out


def split(rows, rng: random.Random):
    """Seeded shuffle, then the last ``DEV_FRACTION`` of rows (at least one) go to dev."""
    rows = list(rows)
    rng.shuffle(rows)
    n_dev = max(1, round(len(rows) * DEV_FRACTION))
    return rows[:-n_dev], rows[-n_dev:]


def preference_pairs(rows, rng: random.Random):
    """One constructed pair per single-turn conversation; see the module docstring."""
    single = [r for r in rows if len(r["src"]) == 1]
    pairs = []
    for r in single:
        while True:
            other = single[rng.randrange(len(single))]
            if other["topic"] != r["topic"] and other["tgt"][0] != r["tgt"][0]:
                break
        chosen, rejected = r["tgt"][0], other["tgt"][0]
        if rng.random() < 0.5:
            response, sort = [chosen, rejected], [1, 0]
        else:
            response, sort = [rejected, chosen], [0, 1]
        pairs.append({"src": [r["src"][0]], "tgt": [], "response": response, "sort": sort,
                      "construction": CONSTRUCTION})
    return pairs


def write_jsonl(path: str, rows) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def build(out: str, seed: int = 0) -> dict:
    """Write the four files under ``out``; returns ``{relative path: number of rows}``."""
    rows = conversations()
    sft_train, sft_dev = split(rows, random.Random(seed))
    strip = lambda rs: [{"src": r["src"], "tgt": r["tgt"]} for r in rs]  # noqa: E731
    pairs = preference_pairs(rows, random.Random(seed + 1))
    pref_train, pref_dev = split(pairs, random.Random(seed + 2))
    files = {"sft/train.json": strip(sft_train), "sft/dev.json": strip(sft_dev),
             "preference/train.jsonl": pref_train, "preference/dev.jsonl": pref_dev}
    for rel, rs in files.items():
        write_jsonl(os.path.join(out, rel), rs)
    return {rel: len(rs) for rel, rs in files.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="output directory")
    ap.add_argument("--seed", type=int, default=0, help="seed of the splits and the pairing")
    args = ap.parse_args(argv)
    for rel, n in build(args.out, args.seed).items():
        print(f"{os.path.join(args.out, rel)}: {n} rows")


if __name__ == "__main__":
    main()
