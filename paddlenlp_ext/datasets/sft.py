"""SFT tokenization: one ``{"src", "tgt"}`` record -> shifted ``input_ids``/``labels`` of one example.

Source: PaddleNLP ``llm/utils/data.py`` (``tokenize_example``, ``tokenize_rounds_example``,
``convert_example_common``), spec 2.2 / 2.3. Output of one example of ``T`` tokens (``T <= max_length - 1``):

- ``input_ids`` [T] int: ``ids[:-1]``; ``labels`` [T] int: ``ids[1:]`` with -100 on non-learned tokens
  (the shift is done here, inside the example, so labels never cross example boundaries in a pack);
- ``position_ids`` [T]: ``0..T-1``; ``attn_mask_startend_row_indices`` [T]: ``[T] * T`` (FlashMask LTS of one
  causal example; packing adds the example's offset).

Worked example (no template, ``max_length=12``; spec 2.3): src "a b c", tgt "x y" ->
``input_ids = <s> a b c x y``, ``labels = -100 -100 -100 x y </s>``, ``position_ids = 0..5``.

Differences from PaddleNLP, deliberate:

- Without a chat template, ALL turns are kept (PaddleNLP keeps only ``src[0]``/``tgt[0]``): each turn is
  ``<bos> src_i`` (not learned) + ``tgt_i </s>`` (learned).
- With a chat template, the conversation is rendered once and tokenized once; assistant spans are found from
  incremental renders (``apply_chat_template`` of the first ``2i+1`` messages with the generation prompt,
  and of the first ``2i+2``), not by splitting the text on answer strings, so an answer repeated earlier in
  the chat cannot corrupt the split and the ids equal those the model sees at inference. Learned tokens:
  every assistant turn's tokens up to and including its end-of-turn token (the first special token after
  the answer, e.g. ``<|im_end|>``); the template's trailing newline is not learned. A template that ends the
  assistant turn with no special token gets ``eos_token`` appended to each assistant turn (learned, with one
  warning), so the model learns to stop; PaddleNLP learns no end token then.
- An example that cannot be made to fit (no learned token left) is dropped and counted; see
  :func:`tokenize_sft_examples`.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
AUTO = "auto"


def _bos_eos(tokenizer) -> Tuple[Optional[int], int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id; SFT without a chat template ends each answer with EOS")
    return getattr(tokenizer, "bos_token_id", None), eos


def _encode(tokenizer, text: str) -> List[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _template_of(tokenizer, chat_template) -> Optional[str]:
    """The Jinja template to use: ``"auto"`` = the tokenizer's (or None), None = no template, str = that."""
    if chat_template == AUTO:
        return getattr(tokenizer, "chat_template", None) or None
    return chat_template


def _special_ids(tokenizer) -> set:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, tok in decoder.items() if getattr(tok, "special", False))
    return ids


def _render(tokenizer, messages, template, add_generation_prompt, context) -> str:
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **context)


def _rounds_plain(src: List[str], tgt: List[str], tokenizer, src_length: int,
                  capped: Optional[list] = None) -> List[Tuple[List[int], List[int]]]:
    """No template: turn i = (``[bos] + src_i`` capped at src_length, ``tgt_i + [eos]``); the indices of capped
    questions are appended to ``capped`` when given."""
    bos, eos = _bos_eos(tokenizer)
    rounds = []
    for i, (s, t) in enumerate(zip(src, tgt)):
        user = ([bos] if bos is not None else []) + _encode(tokenizer, s)
        if capped is not None and len(user) > src_length:
            capped.append(i)
        # PaddleNLP path A always right-truncates the source to src_length (BOS kept, tail cut)
        rounds.append((user[:src_length], _encode(tokenizer, t) + [eos]))
    return rounds


def _rounds_chat(messages: List[dict], tokenizer, template: str, context: dict,
                 ) -> Tuple[List[int], List[Tuple[List[int], List[int]]], List[int]]:
    """Render ``messages`` with the template and split the ids into (system, [(user_i, bot_i)], tail).

    ``user_i`` holds everything before answer i (for i = 0 this includes BOS/system/headers) and is not
    learned; ``bot_i`` holds answer i's tokens through its end-of-turn token. ``system`` is empty: the
    template's prefix belongs to the first turn (as in PaddleNLP's Jinja path). ``tail`` is what follows the
    last end-of-turn token (e.g. ``"\\n"``), not learned.

    Raises:
        ValueError: the template's renders are not prefixes of each other (it re-renders earlier turns
            differently when later ones are added), so spans cannot be located.
    """
    full = _render(tokenizer, messages, template, False, context)
    n = len(messages) // 2
    spans = []  # (answer_start_char, turn_end_char)
    for i in range(n):
        head = _render(tokenizer, messages[: 2 * i + 1], template, True, context)
        upto = _render(tokenizer, messages[: 2 * i + 2], template, False, context)
        if not (full.startswith(head) and full.startswith(upto) and len(head) <= len(upto)):
            raise ValueError(f"the chat template is not prefix-stable at turn {i} (rendering fewer messages does "
                             f"not give a prefix of the full chat); set chat_template to 'none' or fix the template")
        spans.append((len(head), len(upto)))
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"the chat-template path needs a fast tokenizer (character offsets), got "
                         f"{type(tokenizer).__name__}; load it with use_fast=True or set chat_template to 'none'")
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    special = _special_ids(tokenizer)
    rounds, start_tok = [], 0
    for a, e in spans:
        # answer tokens: those overlapping [a, e); a token straddling a belongs to the answer
        first = next((k for k in range(start_tok, len(ids)) if offsets[k][1] > a), len(ids))
        last = first
        while last < len(ids) and offsets[last][0] < e:
            last += 1
        eot = next((k for k in range(first, last) if ids[k] in special), None)
        stop = eot + 1 if eot is not None else last
        # no special token ends the turn: append EOS so the model learns to stop (see _end_of_turn)
        end = [] if eot is not None else _end_of_turn(tokenizer, template)
        rounds.append((ids[start_tok:first], ids[first:stop] + end))
        start_tok = stop
    return [], rounds, ids[start_tok:]


_WARNED_TEMPLATES: set = set()  # one warning per template per process


def _end_of_turn(tokenizer, template: str) -> List[int]:
    """``[eos_token_id]`` to append to an assistant turn that the template ends without a special token (e.g. a
    plain ``"assistant: {{ content }}\n"`` template), or ``[]`` when the tokenizer has no EOS. Warns once per
    template: without it no learned label would mark the end of an answer and the model would never stop.

    PaddleNLP appends nothing here (its Jinja path learns whatever the template renders after the answer), so
    such a template trains a model that does not stop; ours learns ``answer ... </s>`` instead. The EOS also
    stays in the input ids before the next turn (inference renders earlier turns without it).
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    if template not in _WARNED_TEMPLATES:
        _WARNED_TEMPLATES.add(template)
        if eos is None:
            logger.warning("the chat template ends an assistant turn with no special token and the tokenizer has "
                           "no eos_token: no learned label marks the end of an answer, so the model will not learn "
                           "to stop. End the assistant turn in the template with a special token (e.g. "
                           "{{ eos_token }}) or set the tokenizer's eos_token")
        else:
            logger.warning("the chat template ends an assistant turn with no special token (such as <|im_end|> or "
                           "{{ eos_token }}): appending eos_token %r to each assistant turn's learned tokens so the "
                           "model learns to stop (PaddleNLP learns no end token with such a template). End the turn "
                           "with a special token in the template to choose the token yourself",
                           getattr(tokenizer, "eos_token", None))
    return [] if eos is None else [eos]


def _truncate(system: List[int], rounds, src_length: int, max_length: int, cut_last: bool = True):
    """Keep the newest whole turns that fit in ``max_length`` tokens (before the shift); cut the last turn
    alone if it does not fit and ``cut_last``: its user part keeps its first ``src_length - len(system)`` tokens
    and the answer keeps what is left (losing its end token). Returns the kept rounds (empty when nothing fits).
    Source: PaddleNLP ``tokenize_rounds_example``. With a chat template (``cut_last=False``) a cut would remove
    the template's end-of-user and assistant-header tokens and glue the answer to the cut question, so a newest
    turn that does not fit whole drops the example instead (counted by :func:`tokenize_sft_examples`)."""
    budget = max_length - len(system)
    kept, total = [], 0
    for idx in range(len(rounds) - 1, -1, -1):
        user, bot = rounds[idx]
        if total + len(user) + len(bot) <= budget:
            kept.insert(0, (user, bot))
            total += len(user) + len(bot)
            continue
        if idx == len(rounds) - 1 and cut_last:
            user = user[: max(src_length - len(system), 0)]
            bot = bot[: max(budget - len(user), 0)]
            kept.insert(0, (user, bot))
        break
    return kept


def tokenize_sft_example(example: dict, tokenizer, src_length: int, max_length: int,
                         chat_template=AUTO, stats: Optional[dict] = None) -> Optional[Dict[str, List[int]]]:
    """Tokenize one validated SFT record (see :func:`paddlenlp_ext.datasets.jsonl.check_sft_record`).

    Args:
        example: ``{"src": [str], "tgt": [str], "context": {...}?}`` with equal-length lists.
        tokenizer: a Hugging Face tokenizer (``encode``, ``bos/eos_token_id``; for the template path
            ``apply_chat_template`` and a fast tokenizer's ``return_offsets_mapping``).
        src_length: max tokens of a user part (special tokens count). Without a template it caps every
            turn's ``<bos> src_i`` (PaddleNLP right-truncates the source, keeping BOS and the head); with a
            template it is not used (a newest turn that does not fit whole drops the example instead of being
            cut), so only ``max_length`` decides what fits.
        max_length: max tokens of the example before the shift (so ``len(input_ids) <= max_length - 1``).
        chat_template: ``"auto"`` (the tokenizer's template if it has one), None (no template), or a Jinja
            string.
        stats: optional dict; ``stats["truncated"]`` is incremented when the example is returned but not whole
            (older turns dropped; without a template also a question capped at ``src_length`` or the answer cut).

    Truncation (PaddleNLP): whole turns are kept from the newest backwards while they fit; the first older
    turn that does not fit stops it (older turns are dropped). If the newest turn alone does not fit: without
    a template its user part keeps its head (``src_length`` tokens) and the answer keeps the first
    ``max_length - len(user)`` tokens, losing its end token (PaddleNLP); with a template the example is
    dropped (a cut would break the chat format: the answer would follow the cut question with no assistant
    header). With a template, kept turns are rendered as a conversation of their own (template prefix and default
    system prompt first); PaddleNLP keeps the tail of the full render, which then starts mid-format.

    Returns:
        ``{"input_ids", "labels", "position_ids", "attn_mask_startend_row_indices"}`` (lists of int, length T),
        or None when nothing learnable is left after truncation (the caller counts these).
    """
    template = _template_of(tokenizer, chat_template)
    src, tgt = example["src"], example["tgt"]
    if template:
        messages = []
        for s, t in zip(src, tgt):
            messages += [{"role": "user", "content": s}, {"role": "assistant", "content": t}]
        context = dict(example.get("context") or {})
        first = 0  # index of the oldest turn rendered
        while True:
            system, rounds, _ = _rounds_chat(messages[2 * first:], tokenizer, template, context)
            kept = _truncate(system, rounds, src_length, max_length, cut_last=False)
            if len(kept) in (0, len(rounds)):
                break
            # older turns were dropped: render the kept ones as a conversation of their own, so the example
            # starts with the template's prefix (BOS, default system prompt), not with the tail of a dropped
            # turn (e.g. the "\n" after its end-of-turn token); the prefix may push one more turn out
            first += len(rounds) - len(kept)
        shortened = first > 0 or len(kept) < len(rounds)
    else:
        capped: list = []
        system, rounds = [], _rounds_plain(src, tgt, tokenizer, src_length, capped)
        kept = _truncate(system, rounds, src_length, max_length, cut_last=True)
        shortened = bool(capped) or sum(len(u) + len(b) for u, b in kept) < sum(len(u) + len(b) for u, b in rounds)
    ids, labels = list(system), [IGNORE_INDEX] * len(system)
    for user, bot in kept:
        ids += user + bot
        labels += [IGNORE_INDEX] * len(user) + bot
    # shift inside the example: position t predicts token t+1
    input_ids, labels = ids[:-1], labels[1:]
    if len(input_ids) < 1 or all(x == IGNORE_INDEX for x in labels):
        return None
    if shortened and stats is not None:
        stats["truncated"] = stats.get("truncated", 0) + 1
    n = len(input_ids)
    return {"input_ids": input_ids, "labels": labels, "position_ids": list(range(n)),
            "attn_mask_startend_row_indices": [n] * n}


def tokenize_sft_examples(examples: Iterable[dict], tokenizer, src_length: int, max_length: int,
                          chat_template=AUTO, stats: Optional[dict] = None) -> Iterator[Dict[str, List[int]]]:
    """Tokenize a stream of records, dropping (and counting) the ones that cannot fit.

    ``stats`` (optional dict) is updated with ``{"seen", "dropped"}`` and ``"truncated"`` once an example is cut;
    when the stream ends with drops or cuts, a warning gives each count and the key to raise. Yields the dicts of
    :func:`tokenize_sft_example`.
    """
    stats = stats if stats is not None else {}
    stats.setdefault("seen", 0)
    stats.setdefault("dropped", 0)
    for ex in examples:
        stats["seen"] += 1
        rec = tokenize_sft_example(ex, tokenizer, src_length, max_length, chat_template, stats)
        if rec is None:
            stats["dropped"] += 1
            continue
        yield rec
    templated = bool(_template_of(tokenizer, chat_template))
    if stats.get("truncated"):  # older turns dropped, or (no template) questions / the newest answer cut
        how = "older turns dropped" if templated else (f"older turns dropped, questions cut to src_length={src_length} "
                                                       "tokens, or the newest answer cut to what is left")
        logger.warning("%d of %d SFT examples kept only part of their text to fit max_length=%d (%s); raise "
                       "max_length%s to keep them whole", stats["truncated"], stats["seen"], max_length, how,
                       "" if templated else " (and src_length)")
    if stats["dropped"] and templated:
        # src_length plays no part here (a templated turn is never cut): naming it sent users to the wrong key
        logger.warning("dropped %d of %d SFT examples whose newest turn does not fit whole in max_length=%d tokens "
                       "(with a chat template a turn is never cut, and src_length is not used): raise max_length, or "
                       "shorten those examples", stats["dropped"], stats["seen"], max_length)
    elif stats["dropped"]:
        logger.warning("dropped %d of %d SFT examples with no learnable token left after truncation to "
                       "max_length=%d, src_length=%d (an empty answer, or no room left for it): raise max_length or "
                       "lower src_length", stats["dropped"], stats["seen"], max_length, src_length)
