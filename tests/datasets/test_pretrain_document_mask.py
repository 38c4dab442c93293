"""Document masks: with reset_attention_mask and reset_position_ids a window's logits equal each of its documents
run alone; eod_mask_loss drops the label predicted from an end-of-document token; without the flags the batch is
PaddleNLP's (input_ids and labels only, plain causal attention)."""

import sys
import os

import numpy as np
import torch

from paddlenlp_ext.datasets.pretraining import PretrainingCollator, document_layout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "transformers"))
from _llama_testing import tiny_model  # noqa: E402

EOD = 2


def test_layout_of_a_window():
    lts, pos = document_layout(np.array([[5, 2, 7, 8, 2, 9], [1, 1, 1, 1, 1, 1]]), EOD)
    assert lts.tolist() == [[2, 2, 5, 5, 5, 6], [6] * 6]
    assert pos.tolist() == [[0, 1, 0, 1, 2, 0], list(range(6))]


def test_plain_causal_batch_is_paddlenlp_s():
    batch = PretrainingCollator(EOD)([np.array([5, 2, 7, 8]), np.array([1, 2, 3, 4])])
    assert sorted(batch) == ["input_ids", "labels"]
    assert batch["input_ids"].tolist() == [[5, 2, 7], [1, 2, 3]] and batch["labels"].tolist() == [[2, 7, 8], [2, 3, 4]]


def test_eod_mask_loss_drops_the_label_after_an_eod():
    batch = PretrainingCollator(EOD, eod_mask_loss=True)([np.array([5, 2, 7, 8, 2, 9])])
    assert batch["labels"].tolist() == [[2, -100, 8, 2, -100]]


def test_document_masked_window_equals_documents_alone():
    torch.manual_seed(0)
    docs = [[11, 12, 13, EOD], [21, 22, 23, 24, 25, EOD], [31, 32, 33, 34, 35, 36, 37]]  # last one cut by the window
    window = np.array([t for d in docs for t in d][:17])  # L + 1 = 17 tokens
    batch = PretrainingCollator(EOD, reset_attention_mask=True, reset_position_ids=True)([window, window[::-1].copy()])
    assert batch["attn_mask_startend_row_indices"].shape == (2, 1, 16, 1)
    assert batch["attn_mask_startend_row_indices"].dtype == torch.int32
    model = tiny_model()
    with torch.no_grad():
        packed = model(batch["input_ids"], position_ids=batch["position_ids"],
                       attn_mask_startend_row_indices=batch["attn_mask_startend_row_indices"])[0]
        start = 0
        for d in docs:
            piece = torch.tensor([d[: 16 - start]])
            alone = model(piece)[0]
            torch.testing.assert_close(packed[start: start + piece.shape[1]], alone, rtol=1e-5, atol=1e-5)
            start += piece.shape[1]
            if start >= 16:
                break
        plain = model(batch["input_ids"][:1])[0]  # PaddleNLP's causal window: later documents see earlier ones
    assert (plain[4:] - packed[4:]).abs().max() > 1e-3
