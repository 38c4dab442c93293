"""Preference data (DPO and reward model): reading, validation, tokenization, truncation and the one-example layout.

Input: PaddleNLP's preference jsonl, one object per line,
``{"src": str | [str], "tgt": str | [str], "response": [a, b], "sort": [s_a, s_b]}`` with
``len(src) == len(tgt) + 1`` (``src[i]``/``tgt[i]`` are earlier user/assistant turns, ``src[-1]`` is the prompt);
the response with the larger ``sort`` is chosen. Extra keys (e.g. ``construction``) are ignored.

One example is prompt + chosen + rejected in one sequence ("share-question" layout); both responses restart
their positions after the prompt and ``attn_mask_startend_row_indices`` lets both see the prompt and never each
other. Two layouts (``L`` = prompt ids ``p``, chosen ids ``a`` and rejected ids ``b``, each response ending
with its end token, e.g. ``</s>`` or ``<|im_end|>``):

- ``"dpo"`` (PaddleNLP ``paddlenlp/trl/trl_data.py``): ``input = p[:-1] | p[-1] a[:-1] | p[-1] b[:-1]``,
  ``chosen_labels`` = ``a`` on the chosen span, ``rejected_labels`` = ``b`` on the rejected span, -100 elsewhere.
- ``"rm"``: ``input = p | a | b``; the score is read at each response's last token.

``response_indexs = [chosen_start, rejected_start, end, sort_chosen]`` per example (PaddleNLP's record form;
packing offsets the first three, the collator replaces the fourth by the batch row: design.md
``[batch_row, chosen_start, rejected_start, end]``).

Differences from PaddleNLP, each deliberate:

- A chat template is used when the tokenizer has one (PaddleNLP's ``run_dpo.py`` clears it); ``chat_template
  ="none"`` gives PaddleNLP's raw encoding (BOS per user turn, ``</s>`` after each answer).
- Labels ignore with -100 (PaddleNLP DPO uses 0).
- A truncated response is cut without an end token (PaddleNLP puts an EOS label at the cut).
- History turns are added only when the last turn needed no truncation (PaddleNLP can prepend an old turn to a
  cut prompt); otherwise as PaddleNLP: whole turns, newest first, while they fit in ``max_seq_len``.
- RM: no BOS before each response, and multi-turn history is kept in order (PaddleNLP's RM repeats the last
  user turn in place of the first, spec 2.7).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional

from .sft import _end_of_turn, _special_ids

IGNORE_INDEX = -100
LAYOUTS = ("dpo", "rm")


@dataclass
class PreferenceExample:
    """One validated preference example. ``src`` has one more turn than ``tgt``; ``chosen`` has the larger sort."""

    src: List[str]
    tgt: List[str]
    chosen: str
    rejected: str
    sort_chosen: float
    where: str = "<example>"


def check_preference_data(data: dict, where: str = "<example>") -> PreferenceExample:
    """Validate one raw record (PaddleNLP ``check_preference_data``) and order it as chosen, rejected.

    Raises:
        ValueError: naming ``where`` (``file:line``) and the rule broken: missing key, ``len(src) != len(tgt)+1``,
            not exactly 2 responses / 2 sorts, an empty response, a sort that is not a number (or NaN), equal
            sorts, a non-string turn.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a preference record must be a JSON object, got {type(data).__name__}")
    for key in ("src", "tgt", "response", "sort"):
        if key not in data:
            hint = (" (this looks like an SFT record {src, tgt}: train on it with llm/run_finetune.py)"
                    if key in ("response", "sort") and "src" in data and "tgt" in data else "")
            raise ValueError(f"{where}: missing key {key!r}; a record needs src, tgt, response and sort{hint}")
    src = [data["src"]] if isinstance(data["src"], str) else data["src"]
    tgt = [data["tgt"]] if isinstance(data["tgt"], str) else data["tgt"]
    # type check first: a null or numeric src/tgt must give this line, not a TypeError from len() below
    if not isinstance(src, list) or not isinstance(tgt, list) or not all(isinstance(t, str) for t in src + tgt):
        raise ValueError(f"{where}: src and tgt must be a string or a list of strings, got src={data['src']!r:.80}, "
                         f"tgt={data['tgt']!r:.80}")
    if isinstance(data["tgt"], str) and data["tgt"] == "" and len(src) == 1:
        tgt = []  # "tgt": "" with a single src means no history
    if len(src) != len(tgt) + 1:
        raise ValueError(
            f"{where}: rule len(src) == len(tgt) + 1 broken: got {len(src)} src and {len(tgt)} tgt turns "
            "(src[-1] is the prompt, tgt holds the earlier assistant turns)"
        )
    resp, sort = data["response"], data["sort"]
    if not isinstance(resp, list) or not isinstance(sort, list) or len(resp) != 2 or len(sort) != 2:
        raise ValueError(f"{where}: rule 'exactly 2 responses and 2 sorts' broken: got response={resp!r}, sort={sort!r}")
    if not all(isinstance(r, str) and r.strip() for r in resp):
        raise ValueError(f"{where}: rule 'responses must be non-empty strings' broken: got {resp!r}")
    # s == s rejects NaN (json reads a bare NaN token): NaN compares False both ways and cannot order the pair
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and s == s for s in sort):
        raise ValueError(f"{where}: rule 'sort values are numbers' broken: got {sort!r}")
    if sort[0] == sort[1]:
        raise ValueError(f"{where}: rule 'the two sort values differ' broken: got {sort!r}")
    c = 0 if sort[0] > sort[1] else 1
    return PreferenceExample(src=list(src), tgt=list(tgt), chosen=resp[c], rejected=resp[1 - c],
                             sort_chosen=sort[c], where=where)


def read_preference_jsonl(path: str) -> Iterator[PreferenceExample]:
    """Yield validated examples of a jsonl file; blank lines are skipped.

    Records whose two responses are the same text (after stripping whitespace) are kept, as PaddleNLP does, but
    counted: once the file is read, one warning names the count and the first lines (such a pair carries no
    preference: its chosen-minus-rejected margin is 0 whatever the weights, so it gives no preference gradient and
    never counts as accurate).

    Raises:
        FileNotFoundError: ``path`` does not exist (or is a directory).
        ValueError: a line that is not UTF-8, invalid JSON or a broken rule, naming ``path:line``; an empty
            file.
    """
    from .jsonl import jsonl_objects, summarize_lines, warn_once_per_file

    count, same = 0, []
    for where, data in jsonl_objects(path, "preference {src, tgt, response, sort}"):
        count += 1
        ex = check_preference_data(data, where)
        if ex.chosen.strip() == ex.rejected.strip():
            same.append(where)
        yield ex
    if count == 0:
        raise ValueError(f"{path}: empty file (no JSON records); expected one {{src, tgt, response, sort}} object "
                         "per line")
    if same:  # two identical responses give a zero preference signal
        warn_once_per_file(path, "identical responses", (
            f"{path}: {len(same)} of {count} preference records have two identical responses, at "
            f"{summarize_lines(same)}: such a pair carries no preference (its chosen-minus-rejected margin is 0 whatever "
            "the weights: no preference gradient, never counted as accurate) but is trained on; give the rejected "
            "response its own text or remove those lines"))


def _encode(tokenizer, text: str, add_special_tokens: bool) -> List[int]:
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def _messages(src: List[str], tgt: List[str]) -> List[dict]:
    msgs = []
    for i, s in enumerate(src):
        msgs.append({"role": "user", "content": s.strip()})
        if i < len(tgt):
            msgs.append({"role": "assistant", "content": tgt[i].strip()})
    return msgs


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer, src: List[str], tgt: List[str], use_chat_template: bool) -> List[int]:
    """Token ids of the prompt: history turns ``(src[i], tgt[i])`` then the last user turn ``src[-1]``.

    Chat template: the rendered conversation with the generation prompt (``add_generation_prompt=True``),
    tokenized without extra special tokens. Raw (PaddleNLP ``run_dpo``): per history turn
    ``encode(src_i, special) + encode(tgt_i) + [eos]``, then ``encode(src_last, special)``.
    """
    if use_chat_template:
        text = tokenizer.apply_chat_template(_messages(src, tgt), tokenize=False, add_generation_prompt=True)
        return _encode(tokenizer, text, add_special_tokens=False)
    ids: List[int] = []
    for s, t in zip(src[:-1], tgt):
        ids += _encode(tokenizer, s.strip(), True) + _encode(tokenizer, t.strip(), False) + [tokenizer.eos_token_id]
    return ids + _encode(tokenizer, src[-1].strip(), True)


def encode_response(tokenizer, src: List[str], tgt: List[str], response: str, use_chat_template: bool) -> List[int]:
    """Token ids of one answer including its end token (``<|im_end|>`` under ChatML, else ``eos``).

    Chat template: the text the template appends for the assistant turn after the generation prompt, cut after
    the last end-of-turn token (``eos_token``), so a trailing newline is not learned. A turn that ends with no
    special token gets ``eos_token`` appended (with SFT's one warning per template, ``sft._end_of_turn``).

    Raises:
        ValueError: the template does not render the generation prompt as a prefix of the full conversation.
    """
    if not use_chat_template:
        return _encode(tokenizer, response.strip(), False) + [tokenizer.eos_token_id]
    msgs = _messages(src, tgt)
    prompt = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": response.strip()}], tokenize=False)
    if not full.startswith(prompt):
        raise ValueError("the chat template does not render the generation prompt as a prefix of the conversation; "
                         "set chat_template to 'none' to use raw encoding")
    suffix = full[len(prompt):]
    eos = getattr(tokenizer, "eos_token", None)
    if eos and eos in suffix:
        suffix = suffix[: suffix.rindex(eos) + len(eos)]
        answer, end = suffix[: -len(eos)], eos
        return _encode(tokenizer, answer, False) + _encode(tokenizer, end, False)
    ids = _encode(tokenizer, suffix, False)
    if _special_ids(tokenizer).isdisjoint(ids):
        # no special token ends the turn (e.g. "assistant: {{ content }}\n"): append EOS as SFT does, so the
        # chosen response teaches the policy to stop (the raw encoding above ends with eos too)
        ids += _end_of_turn(tokenizer, tokenizer.chat_template)
    return ids


def truncate(p: List[int], a: List[int], b: List[int], budget: int, max_prompt_len: int):
    """PaddleNLP's truncation (spec 2.6) on ``len(p) + len(a) + len(b) <= budget``.

    1. Too long: keep the last ``max_prompt_len`` prompt tokens.
    2. Still too long: with ``M = budget - len(p)``, ``a`` keeps ``int(len(a)/(len(a)+len(b)) * M)`` tokens
       from its start, ``b`` the rest (at least 1 each).

    Returns ``(p, a, b, truncated)``; ``None`` if the responses cannot get one token each.
    """
    if len(p) + len(a) + len(b) <= budget:
        return p, a, b, False
    p = p[-max_prompt_len:]
    if len(p) + len(a) + len(b) > budget:
        m = budget - len(p)
        if m < 2:
            return None
        ma = min(max(int(len(a) / (len(a) + len(b)) * m), 1), m - 1)
        a, b = a[:ma], b[: m - ma]
    return p, a, b, True


def tokenize_preference_example(
    ex: PreferenceExample,
    tokenizer,
    *,
    max_seq_len: int,
    max_prompt_len: int,
    layout: str = "dpo",
    use_chat_template: Optional[bool] = None,
    stats: Optional[dict] = None,
) -> Optional[dict]:
    """Tokenize, truncate and lay out one example (see the module docstring).

    Args:
        ex: from ``check_preference_data``.
        tokenizer: a Hugging Face-style tokenizer (``encode``, ``eos_token_id``, optional ``apply_chat_template``).
        max_seq_len: the example's maximum length in the pack (``S <= max_seq_len``).
        max_prompt_len: prompt tokens kept (from the end) when the example is too long.
        layout: ``"dpo"`` or ``"rm"``.
        use_chat_template: None = use the tokenizer's template if it has one.
        stats: optional dict; ``stats["truncated"]`` is incremented when the example had to be cut.

    Returns:
        dict of lists (length ``S``): ``input_ids``, ``position_ids``, ``attn_mask_startend_row_indices``, and
        for ``"dpo"`` ``chosen_labels``/``rejected_labels``; ``response_indexs = [[P, P+R0, S, sort_chosen]]``.
        ``None`` when the example cannot fit (fewer than 2 response tokens of room).

    Raises:
        ValueError: unknown layout, empty prompt, or ``max_prompt_len`` leaving no room for the responses.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not 0 < max_prompt_len <= max_seq_len - 2:
        raise ValueError(f"need 0 < max_prompt_len ({max_prompt_len}) <= max_seq_len - 2 ({max_seq_len - 2}) "
                         "so both responses keep at least one token")
    if use_chat_template is None:
        use_chat_template = has_chat_template(tokenizer)
    shift = 1 if layout == "dpo" else 0  # the DPO layout moves the last prompt token into both responses
    last = ex.src[-1:]
    p = encode_prompt(tokenizer, last, [], use_chat_template)
    if not p:
        raise ValueError(f"{ex.where}: the prompt encodes to no tokens; give a non-empty src")
    a = encode_response(tokenizer, last, [], ex.chosen, use_chat_template)
    b = encode_response(tokenizer, last, [], ex.rejected, use_chat_template)
    cut = truncate(p, a, b, max_seq_len + shift, max_prompt_len + shift)
    if cut is None:
        return None
    p, a, b, truncated = cut
    if truncated and stats is not None:
        stats["truncated"] = stats.get("truncated", 0) + 1
    if not truncated:  # add whole history turns, newest first, while they fit (re-rendered for templates)
        for h in range(len(ex.tgt), 0, -1):
            ph = encode_prompt(tokenizer, ex.src[-h - 1:], ex.tgt[-h:], use_chat_template)
            if len(ph) + len(a) + len(b) - shift <= max_seq_len:
                p = ph
                break
    return _layout(p, a, b, shift, ex.sort_chosen)


def _layout(p: List[int], a: List[int], b: List[int], shift: int, sort_chosen) -> dict:
    if shift:  # DPO: input p[:-1] | p[-1] a[:-1] | p[-1] b[:-1]; labels a, b
        prompt, seg_a, seg_b = p[:-1], p[-1:] + a[:-1], p[-1:] + b[:-1]
    else:  # RM: input p | a | b
        prompt, seg_a, seg_b = p, a, b
    P, R0, R1 = len(prompt), len(seg_a), len(seg_b)
    S = P + R0 + R1
    rec = {
        "input_ids": prompt + seg_a + seg_b,
        "position_ids": list(range(P)) + list(range(P, P + R0)) + list(range(P, P + R1)),
        # LTS: prompt and rejected keys are seen by every later row of the example; chosen keys only up to P+R0.
        "attn_mask_startend_row_indices": [S] * P + [P + R0] * R0 + [S] * R1,
        "response_indexs": [[P, P + R0, S, sort_chosen]],
    }
    if shift:
        rec["chosen_labels"] = [IGNORE_INDEX] * P + a + [IGNORE_INDEX] * R1
        rec["rejected_labels"] = [IGNORE_INDEX] * (P + R0) + b
    return rec


# ------------------------------------------------------------------------------------------- datasets, collator
REFERENCE_KEYS = ("reference_chosen_logps", "reference_rejected_logps")
_DEFAULT_PATHS = {"train": "./data/train.jsonl", "dev": "./data/dev.jsonl"}  # DPO/RM DataArgument defaults


class _TokenizedPreferenceStream:
    """Re-iterable stream of tokenized preference records from one jsonl file (re-read on every ``iter``)."""

    def __init__(self, path, tokenizer, max_seq_len, max_prompt_len, layout, use_chat_template):
        self.path, self.tokenizer, self.layout = path, tokenizer, layout
        self.max_seq_len, self.max_prompt_len, self.use_chat_template = max_seq_len, max_prompt_len, use_chat_template
        self.stats: dict = {}
        self._warned = False

    def __iter__(self):
        self.stats = {"examples": 0, "skipped": 0, "truncated": 0}
        for ex in read_preference_jsonl(self.path):
            self.stats["examples"] += 1
            rec = tokenize_preference_example(ex, self.tokenizer, max_seq_len=self.max_seq_len,
                                              max_prompt_len=self.max_prompt_len, layout=self.layout,
                                              use_chat_template=self.use_chat_template, stats=self.stats)
            if rec is None:
                self.stats["skipped"] += 1
                continue
            yield rec
        if not self._warned and (self.stats["truncated"] or self.stats["skipped"]):
            self._warned = True  # once per file: a lazy stream is read again every epoch
            # a too small max_seq_len cuts most responses (their end token lost): say so once per file
            logging.getLogger(__name__).warning(
                "%s: %d of %d preference examples cut to fit max_seq_len=%d (PaddleNLP's rule: the prompt to its "
                "last max_prompt_len=%d tokens, then the responses lose their tails, end token included)%s; raise "
                "max_seq_len (and max_prompt_len) to keep them whole", self.path, self.stats["truncated"], self.stats["examples"], self.max_seq_len,
                self.max_prompt_len, f", {self.stats['skipped']} dropped (no room left)" if self.stats["skipped"] else "")


def create_preference_datasets(data_args, tokenizer, layout: str = "dpo", splits=("train", "dev")) -> dict:
    """``{split: ZeroPadding dataset of packs}`` from ``data_args.{train,dev}_dataset_path`` (PaddleNLP
    ``run_dpo.py`` / ``run_reward.py`` data flow: every split is packed with capacity ``max_seq_len``; greedy
    packing on train only when ``greedy_zero_padding``; ``lazy`` streams the train split).

    ``data_args.chat_template`` (see ``paddlenlp_ext.datasets.builder.resolve_chat_template``): None = the
    tokenizer's template if any, ``"none"`` = raw PaddleNLP encoding, a file = that Jinja template (set on the
    tokenizer). A split whose path is empty/None is left out; a missing file raises FileNotFoundError.
    """
    from .builder import resolve_chat_template
    from .sft import AUTO
    from .zero_padding import ZeroPaddingIterableDataset, ZeroPaddingMapDataset

    template = resolve_chat_template(getattr(data_args, "chat_template", None))
    if template is None:
        use_template = False
    elif template == AUTO:
        use_template = has_chat_template(tokenizer)
    else:
        tokenizer.chat_template = template
        use_template = True
    paths = {"train": data_args.train_dataset_path, "dev": data_args.dev_dataset_path}
    for split in splits:  # before any tokenising, naming the key (a default path is easy to overlook)
        path = paths.get(split)
        if path and not os.path.exists(path):
            key = f"{split}_dataset_path"
            default = " (its default)" if path == _DEFAULT_PATHS[split] else ""
            where = "" if os.path.isabs(path) else f", relative to the current directory {os.getcwd()}"
            why = "do_eval or an evaluation_strategy" if split == "dev" else "do_train"
            raise FileNotFoundError(f"{key}={path!r}{default} does not exist{where}: set {key} to a preference jsonl "
                                    f"file (this run reads the {split} split for {why})")
    out = {}
    for split in splits:
        if not paths.get(split):
            continue
        stream = _TokenizedPreferenceStream(paths[split], tokenizer, data_args.max_seq_len, data_args.max_prompt_len,
                                            layout, use_template)
        greedy = bool(data_args.greedy_zero_padding) and split == "train"
        if getattr(data_args, "lazy", False) and split == "train":
            out[split] = ZeroPaddingIterableDataset(stream, tokenizer, data_args.max_seq_len, greedy)
        else:
            out[split] = ZeroPaddingMapDataset(stream, tokenizer, data_args.max_seq_len, greedy)
    return out


class PreferenceCollator:
    """``collate_fn`` for preference packs: ``paddlenlp_ext.datasets.collate.collate_packs`` (pad to
    ``max_seq_len``; labels -100, startend 0, ``response_indexs`` -> ``[batch_row, chosen_start,
    rejected_start, end]``) plus, when every pack holds them, ``reference_chosen_logps`` and
    ``reference_rejected_logps`` as float32 ``[N_pairs]`` in ``response_indexs`` order."""

    def __init__(self, max_seq_len: int, pad_token_id: int = 0):
        self.max_seq_len, self.pad_token_id = max_seq_len, pad_token_id

    def __call__(self, packs) -> dict:
        import torch

        from .collate import collate_packs

        batch = collate_packs(packs, self.max_seq_len, self.pad_token_id)
        if all(k in p for p in packs for k in REFERENCE_KEYS):
            for k in REFERENCE_KEYS:
                batch[k] = torch.tensor([v for p in packs for v in p[k]], dtype=torch.float32)  # [N_pairs]
        return batch


def build_preference_data(data_args, tokenizer, layout: str, splits=("train", "dev")):
    """``(train_ds, dev_ds, collator)`` for ``run_dpo.py`` / ``run_reward.py``: the packed ``splits`` of
    :func:`create_preference_datasets` (None for a split not asked for or without a path) and a
    :class:`PreferenceCollator` padding to ``max_seq_len`` with the tokenizer's pad id (else its eos id, else 0).
    Logs the pack counts."""
    import logging

    datasets = create_preference_datasets(data_args, tokenizer, layout=layout, splits=splits)
    for split, ds in datasets.items():
        if hasattr(ds, "__len__"):
            logging.getLogger(__name__).info("%s: %d packs of up to %d tokens", split, len(ds), data_args.max_seq_len)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    return datasets.get("train"), datasets.get("dev"), PreferenceCollator(data_args.max_seq_len, pad)
