"""Render a FlashMask as a PNG (rows = queries, columns = keys), or as text.

``plot_mask(sri, causal, "mask.png")`` draws the dense allowed-mask of one (batch, head) and, with matplotlib,
marks each column's LTS / LTE / UTS / UTE boundaries. Without matplotlib it writes a plain PNG with a small
pure-Python (zlib) writer. Command line::

    python -m flashmask.plot causal_document --lengths 3,3,2 --out mask.png
    python -m flashmask.plot share_question --samples "3:3,2;2:1,1" --text
    python -m flashmask.plot sliding_window --seq-len 12 --window 2,2 --bidirectional --out sw.png
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import zlib

import torch

from . import masks as M
from .dense import expand_startend, to_dense

_ALLOWED_RGB, _MASKED_RGB, _GRID_RGB = (40, 90, 170), (236, 236, 236), (255, 255, 255)
_VEC_COLORS = {"LTS": "tab:red", "LTE": "tab:orange", "UTS": "tab:green", "UTE": "tab:purple"}


def write_png(path: str, pixels: list[list[tuple[int, int, int]]]) -> None:
    """Write an 8-bit RGB PNG (``pixels[row][col] = (r, g, b)``) with zlib only (PNG spec, ISO/IEC 15948)."""
    h, w = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)  # filter 0 per scanline

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def mask_text(startend_row_indices: torch.Tensor, causal: bool, batch: int = 0, head: int = 0,
              seq_q: int | None = None) -> str:
    """The vectors and the allowed matrix as text (``1`` = attend), in the layout of the FlashMask brief §1.5."""
    sri = startend_row_indices[batch : batch + 1, head : head + 1]
    allowed = to_dense(sri, causal, seq_q=seq_q)[0, 0]
    names = {(True, 1): "LTS", (True, 2): "LTS LTE", (False, 2): "LTS UTE", (False, 4): "LTS LTE UTS UTE"}
    lines = [f"causal={causal}, C={sri.shape[-1]}, S_q={allowed.shape[0]}, S_k={allowed.shape[1]}"]
    width = len(str(allowed.shape[0]))
    lines.append("col j : " + " ".join(f"{j:>{width}}" for j in range(allowed.shape[1])))
    for c, name in enumerate(names[(causal, sri.shape[-1])].split()):
        lines.append(f"{name:<6}: " + " ".join(f"{int(x):>{width}}" for x in sri[0, 0, :, c]))
    lines += [f"  q{i:<{width}} " + "".join("1" if a else "0" for a in row) for i, row in enumerate(allowed.tolist())]
    return "\n".join(lines)


def plot_mask(startend_row_indices, causal: bool | None = None, path: str = "mask.png", *, batch: int = 0,
              head: int = 0, seq_q: int | None = None, title: str | None = None, backend: str = "auto") -> str:
    """Draw the allowed-mask of one (batch, head) to ``path`` (PNG); returns the backend used.

    Args:
        startend_row_indices: int32 ``[B, H_mask, S_k, C]``, or a :class:`flashmask.masks.FlashMask` (then
            ``causal`` may be omitted).
        causal: the FlashMask mode the vectors are meant for.
        path: output file. ``batch``/``head``: which mask to draw; ``seq_q`` defaults to S_k.
        backend: ``"matplotlib"`` (dense image plus per-column vector boundaries and a legend), ``"png"`` (plain
            pixels, 1 cell = up to 16 px, no dependency) or ``"auto"`` (matplotlib if importable).

    Raises:
        ValueError: unknown backend, or ``causal`` missing for a raw tensor.
    """
    if isinstance(startend_row_indices, M.FlashMask):
        causal = startend_row_indices.causal if causal is None else causal
        startend_row_indices = startend_row_indices.startend_row_indices
    if causal is None:
        raise ValueError("plot_mask needs causal=True/False for a raw startend_row_indices tensor")
    if backend not in ("auto", "matplotlib", "png"):
        raise ValueError(f"backend must be 'auto', 'matplotlib' or 'png', got {backend!r}")
    sri = startend_row_indices[batch : batch + 1, head : head + 1].cpu()
    allowed = to_dense(sri, causal, seq_q=seq_q)[0, 0]  # [S_q, S_k]
    if backend == "auto":
        try:
            import matplotlib  # noqa: F401

            backend = "matplotlib"
        except ImportError:
            backend = "png"
    if backend == "png":
        _plot_png(allowed, path)
    else:
        _plot_matplotlib(sri, causal, allowed, path, title)
    return backend


def _plot_png(allowed: torch.Tensor, path: str) -> None:
    s_q, s_k = allowed.shape
    cell = max(1, min(16, 1024 // max(s_q, s_k)))
    gap = 1 if cell >= 4 else 0  # a 1-px white grid between cells when they are large enough
    pixels = []
    for i in range(s_q):
        row = []
        for j in range(s_k):
            color = _ALLOWED_RGB if allowed[i, j] else _MASKED_RGB
            row += [color] * (cell - gap) + [_GRID_RGB] * gap
        pixels += [row] * (cell - gap) + [[_GRID_RGB] * len(row)] * gap
    write_png(path, pixels)


def _plot_matplotlib(sri: torch.Tensor, causal: bool, allowed: torch.Tensor, path: str, title: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    s_q, s_k = allowed.shape
    size = min(12.0, 3.0 + 0.35 * max(s_q, s_k))
    fig, ax = plt.subplots(figsize=(size, size * s_q / s_k + 0.6))
    cmap = ListedColormap([[c / 255 for c in _MASKED_RGB], [c / 255 for c in _ALLOWED_RGB]])
    ax.imshow(allowed.int().numpy(), cmap=cmap, vmin=0, vmax=1, interpolation="nearest", aspect="equal")
    present = {(True, 1): ["LTS"], (True, 2): ["LTS", "LTE"], (False, 2): ["LTS", "UTE"],
               (False, 4): ["LTS", "LTE", "UTS", "UTE"]}[(causal, sri.shape[-1])]
    vecs = dict(zip(("LTS", "LTE", "UTS", "UTE"), (v[0, 0] for v in expand_startend(sri, causal, s_q))))
    for name in present:  # a short bar at row boundary v_j - 0.5 across column j marks each vector value
        ys = vecs[name].tolist()
        for j, y in enumerate(ys):
            ax.plot([j - 0.45, j + 0.45], [y - 0.5, y - 0.5], color=_VEC_COLORS[name], lw=2.5,
                    label=name if j == 0 else None, solid_capstyle="butt")
    if max(s_q, s_k) <= 64:
        ax.set_xticks(range(s_k))
        ax.set_yticks(range(s_q))
        ax.set_xticks([x - 0.5 for x in range(s_k + 1)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(s_q + 1)], minor=True)
        ax.grid(which="minor", color="white", lw=0.8)
        ax.tick_params(which="both", labelsize=7, length=0)
    ax.set_xlim(-0.5, s_k - 0.5)
    ax.set_ylim(s_q - 0.5 + 0.3, -0.5 - 0.3)  # margins so bars at row 0 and row S_q stay visible
    ax.set_xlabel("key column j")
    ax.set_ylabel("query row i")
    ax.set_title(title or f"FlashMask causal={causal}, C={sri.shape[-1]} (blue = attend)", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
              title="column masked\nfrom LTS to LTE,\nfrom UTS to UTE", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------- command line

def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, e.g. 3,3,2; got {text!r}") from None


def _build(args) -> M.FlashMask:
    name, s = args.mask, args.seq_len
    rows = [_ints(r) for r in args.lengths.split(";")] if args.lengths else None
    window = _ints(args.window) if args.window else [2]
    window = window[0] if len(window) == 1 else tuple(window)
    need = {"lengths": rows, "seq_len": s}
    if name in ("causal_document", "document", "causal_blockwise", "block_causal", "prefix_lm_document"):
        if rows is None:
            raise SystemExit(f"{name} needs --lengths, e.g. --lengths 3,3,2 (rows separated by ';')")
    elif name != "share_question" and s is None:
        raise SystemExit(f"{name} needs --seq-len")
    if name == "causal":
        return M.causal_mask(s)
    if name == "full":
        return M.full_mask(s)
    if name == "sliding_window":
        return M.sliding_window_mask(s, window, causal=not args.bidirectional, sink_tokens=args.sinks)
    if name == "global_sliding_window":
        return M.global_sliding_window_mask(s, args.global_tokens, window)
    if name == "causal_document":
        return M.causal_document_mask(**need)
    if name == "document":
        return M.document_mask(**need)
    if name == "causal_blockwise":
        return M.causal_blockwise_mask(**need)
    if name == "block_causal":
        return M.block_causal_mask(**need)
    if name == "prefix_lm_causal":
        return M.prefix_lm_causal_mask(s, args.prefix)
    if name == "prefix_lm_document":
        if not args.prefixes:
            raise ValueError("needs --prefixes, one prefix length per document shaped like --lengths "
                             "(e.g. --lengths 3,2 --prefixes 1,2)")
        return M.prefix_lm_document_mask(rows, [_ints(r) for r in args.prefixes.split(";")], s)
    if name == "share_question":
        samples = []
        for part in args.samples.split(";"):
            q, sep, answers = part.partition(":")
            if not sep or not q.strip().isdigit():
                raise ValueError(f"--samples {args.samples!r}: each sample is prompt:answer,answer (e.g. 3:3,2), "
                                 f"samples separated by ';'")
            samples.append((int(q), _ints(answers)))
        return M.share_question_mask(samples, s)
    if name == "qk_sparse":
        ranges = [tuple(_ints(r.replace("-", ","))) for r in args.ranges.split(";")]
        if any(len(r) != 2 for r in ranges):
            raise ValueError(f"--ranges {args.ranges!r}: each range is a-b (e.g. 2-5), ranges separated by ';'")
        return M.qk_sparse_mask(s, ranges)
    if name == "random_eviction":
        return M.random_eviction_mask(s, args.prob, seed=args.seed)
    if name == "key_padding":
        return M.key_padding_mask([args.valid], s, causal=not args.bidirectional)
    if name == "query_padding":
        return M.query_padding_mask([args.valid], s, causal=not args.bidirectional)
    raise SystemExit(f"unknown mask {name!r}")


MASK_NAMES = ("causal", "full", "sliding_window", "global_sliding_window", "causal_document", "document",
              "causal_blockwise", "block_causal", "prefix_lm_causal", "prefix_lm_document", "share_question",
              "qk_sparse", "random_eviction", "key_padding", "query_padding")


def main(argv: list[str] | None = None) -> int:
    """``python -m flashmask.plot MASK [options] --out mask.png`` (or ``--text``); see the module docstring."""
    p = argparse.ArgumentParser(prog="python -m flashmask.plot", description="Draw a FlashMask built by name.")
    p.add_argument("mask", choices=MASK_NAMES)
    p.add_argument("--seq-len", type=int, help="sequence length S (pads document masks)")
    p.add_argument("--lengths", help="document lengths, e.g. 3,3,2 (several rows: 3,3;4,2)")
    p.add_argument("--prefixes", help="prefix_lm_document: prefix per document, shaped like --lengths")
    p.add_argument("--prefix", type=int, default=0, help="prefix_lm_causal: prefix length")
    p.add_argument("--window", help="window w, or wl,wr")
    p.add_argument("--bidirectional", action="store_true", help="non-causal variant (sliding window, padding)")
    p.add_argument("--sinks", type=int, default=0, help="sliding_window: sink tokens")
    p.add_argument("--global-tokens", type=int, default=1)
    p.add_argument("--samples", default="3:3,2", help="share_question: 'prompt:answer,answer;...'")
    p.add_argument("--ranges", default="2-5", help="qk_sparse: 'a-b;c-d'")
    p.add_argument("--prob", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--valid", type=int, default=0, help="key/query padding: number of real tokens")
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--out", help="PNG path")
    p.add_argument("--backend", default="auto", choices=("auto", "matplotlib", "png"))
    p.add_argument("--text", action="store_true", help="print vectors and the allowed matrix")
    args = p.parse_args(argv)
    if args.out and not args.out.lower().endswith(".png"):
        p.error(f"--out {args.out!r}: the plot is a PNG; give a path ending in .png (or --text for a text dump)")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        p.error(f"--out {args.out!r}: directory {os.path.dirname(os.path.abspath(args.out))!r} does not exist")
    if args.seq_len is not None and args.seq_len < 1:
        p.error(f"--seq-len must be >= 1, got {args.seq_len}")
    try:
        m = _build(args)
    except ValueError as e:  # a builder's message names the argument and the rule
        p.error(f"{args.mask}: {e}")
    rows = m.startend_row_indices.shape[0]
    if not 0 <= args.batch < rows:
        p.error(f"--batch {args.batch}: the mask has {rows} batch row(s), give 0..{rows - 1}")
    if args.text or not args.out:
        print(mask_text(m.startend_row_indices, m.causal, batch=args.batch))
    if args.out:
        used = plot_mask(m, path=args.out, batch=args.batch, backend=args.backend)
        print(f"wrote {args.out} ({used})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
