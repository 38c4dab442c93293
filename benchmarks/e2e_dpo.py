"""DPO rows of ``benchmarks/e2e_train.py``: share-question packs vs chosen/rejected as separate sequences.

Both layouts train the same preference pairs with the same loss code (``paddlenlp_ext.trl``: ``policy_pair_logps``
through ``hidden_states_and_head`` and chunked ``token_logps``, then ``DPOCriterion`` sigmoid, beta 0.1):

- ``dpo_shared``: PaddleNLP's layout (``paddlenlp_ext.datasets.preference._layout``): one example is
  ``prompt | chosen | rejected``, both responses restart their positions after the prompt and the FlashMask LTS
  lets each see the prompt but not each other, so the prompt is encoded once.
- ``dpo_separate``: the same pair as two independent causal sequences ``prompt + chosen`` and ``prompt +
  rejected`` (positions from 0, each its own document in the pack, the prompt encoded twice): what a trainer without
  share-question masks does. The two sequences of a pair stay adjacent in one record, so ``response_indexs``
  (chosen span = the first sequence's response, rejected span = the second sequence) and the loss code are shared.

Pairs: per pair one length ``n ~ LogNormal(ln 661, 0.985)`` gives prompt ``n // 3`` and chosen ``n - n // 3``;
a second draw gives the rejected response; responses are trimmed so the separate layout fits ``pack_len``. Token
ids are uniform. Reference log-probs are treated as precomputed (zeros; PaddleNLP's ``precompute_reference_logps``
analogue), so the timed step is the policy forward + backward + AdamW, as in the SFT rows. Note: the trl code
validates labels and gathers label positions with host syncs (``.any()``, ``nonzero``) in every step.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from paddlenlp_ext.datasets import ZeroPaddingMapDataset
from paddlenlp_ext.datasets.preference import PreferenceCollator, _layout

MEDIAN, MEAN = 661.0, 1074.0
SIGMA = math.sqrt(2 * math.log(MEAN / MEDIAN))
IGNORE = -100


def make_pairs(n: int, vocab: int, pack_len: int, seed: int, scale: float) -> list[tuple[list, list, list]]:
    """``n`` pairs ``(prompt, chosen, rejected)`` of token ids (see module doc); ``2 p + a + b <= pack_len``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        n1, n2 = (max(8, int(round(x * scale))) for x in rng.lognormal(math.log(MEDIAN), SIGMA, 2))
        p = max(2, min(n1 // 3, pack_len // 4))
        room = (pack_len - 2 * p) // 2
        a, b = max(2, min(n1 - n1 // 3, room)), max(2, min(n2 - n2 // 3, room))
        ids = rng.integers(1, vocab, p + a + b).tolist()
        out.append((ids[:p], ids[p: p + a], ids[p + a:]))
    return out


def shared_record(p, a, b) -> dict:
    """Share-question record: PaddleNLP's DPO layout (``_layout`` with the label shift)."""
    return _layout(p, a, b, 1, 1.0)


def separate_record(p, a, b) -> dict:
    """``p + a[:-1]`` then ``p + b[:-1]`` as two causal documents in one record; labels ``a`` / ``b`` on the
    response positions; ``response_indexs`` = [first response start, second sequence start, end, sort]."""
    s1, s2 = p + a[:-1], p + b[:-1]
    n1, n2 = len(s1), len(s2)
    return {"input_ids": s1 + s2, "position_ids": list(range(n1)) + list(range(n2)),
            "attn_mask_startend_row_indices": [n1] * n1 + [n1 + n2] * n2,
            "chosen_labels": [IGNORE] * (len(p) - 1) + a + [IGNORE] * n2,
            "rejected_labels": [IGNORE] * n1 + [IGNORE] * (len(p) - 1) + b,
            "response_indexs": [[len(p) - 1, n1, n1 + n2, 1.0]]}


def lts_pairs(sri_row) -> int:
    """Unmasked (query, key) pairs of a causal C=1 FlashMask row: ``sum_j max(0, LTS_j - j)``."""
    lts = np.asarray(sri_row, dtype=np.int64).reshape(-1)
    return int(np.clip(lts - np.arange(lts.size), 0, None).sum())


def build_dpo_batches(layout: str, vocab: int, pack_len: int, n_groups: int, seed: int, scale: float, device):
    """``n_groups`` groups of device batches (one pack per batch). Groups are the share-question packs; the
    separate layout packs each group's pairs on their own, so both layouts time the same pairs.

    Each batch carries python ints ``_tokens`` (non-padding tokens), ``_pairs`` (attention pairs) and
    ``_n_pairs`` (preference pairs).
    """
    n_pairs = max(32, int(n_groups * pack_len / (1.7 * MEAN * scale)) + 8)
    while True:
        pairs = make_pairs(n_pairs, vocab, pack_len, seed, scale)
        shared = ZeroPaddingMapDataset([shared_record(*t) for t in pairs], max_length=pack_len,
                                       greedy_zero_padding=True)
        if len(shared) >= n_groups + 2:
            break
        n_pairs *= 2
    collate = PreferenceCollator(pack_len)
    groups = []
    for gi in range(n_groups):
        pack = shared[gi]
        if layout == "dpo_shared":
            members = [pack]
        else:  # the pairs of this share-question pack, re-laid out and packed on their own
            recs, off = [], 0
            for n, (cs, rs, e, _) in zip(pack["seq_lens"], pack["response_indexs"]):
                ids = pack["input_ids"][off: off + n]
                p_len = cs - off + 1
                p = ids[:p_len]
                a = pack["chosen_labels"][cs: rs]
                b = pack["rejected_labels"][rs: e]
                recs.append(separate_record(p, a, b))
                off += n
            members = list(ZeroPaddingMapDataset(recs, max_length=pack_len, greedy_zero_padding=True))
        group = []
        for m in members:
            batch = collate([m])
            batch["_tokens"] = len(m["input_ids"])
            batch["_pairs"] = lts_pairs(m["attn_mask_startend_row_indices"])
            batch["_n_pairs"] = len(m["response_indexs"])
            group.append({k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()})
        groups.append(group)
    return groups


def dpo_loss(model, batch: dict, criterion=None):
    """``(loss_sum, n_pairs)`` of one preference pack: trl policy log-probs, sigmoid DPO against zero reference
    log-probs (precomputed-reference stand-in)."""
    from paddlenlp_ext.trl.dpo_criterion import DPOCriterion, PairLogps
    from paddlenlp_ext.trl.dpo_trainer import policy_pair_logps

    criterion = criterion or DPOCriterion(loss_type="sigmoid", beta=0.1)
    policy = policy_pair_logps(model, batch, chunk_size=1024)
    zeros = torch.zeros_like(policy.chosen)
    ref = PairLogps(zeros, zeros, policy.chosen_tokens, policy.rejected_tokens)
    loss_sum, _ = criterion(policy, ref)
    return loss_sum, batch["_n_pairs"]
