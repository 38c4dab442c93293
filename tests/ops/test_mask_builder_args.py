"""flashmask.masks builders: arguments of the wrong form give a ValueError naming the argument and the expected
form (they were raw TypeErrors: "'int' object is not iterable", "cannot unpack non-iterable float object", ...)."""

import pytest
import torch

import flashmask.masks as M


@pytest.mark.parametrize("call,msg", [
    (lambda: M.key_padding_mask(2, 3), r"valid_lengths must be a list .*one int per batch row.*\[2\]"),
    (lambda: M.query_padding_mask(2, 3), r"valid_lengths must be a list"),
    (lambda: M.sliding_window_mask(5, 1.5), r"window_size must be an int w or a pair \(wl, wr\)"),
    (lambda: M.global_sliding_window_mask(4, 1, (1,)), r"window_size must be an int w or a pair \(wl, wr\)"),
    (lambda: M.qk_sparse_mask(4, (1, 3)), r"ranges must be a list of \(a, b\) pairs"),
    (lambda: M.random_eviction_mask(4, 0.5, num_heads=0), r"num_heads and batch_size must be >= 1"),
])
def test_wrong_argument_forms(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_accepted_forms_still_work():
    assert M.key_padding_mask([2], 3).startend_row_indices[0, 0, :, 0].tolist() == [3, 3, 0]
    assert M.key_padding_mask(torch.tensor([2]), 3).startend_row_indices.shape == (1, 1, 3, 2)
    assert torch.equal(M.sliding_window_mask(5, (1, 0)).startend_row_indices,
                       M.sliding_window_mask(5, 1).startend_row_indices)
    assert M.qk_sparse_mask(4, [(1, 3)]).startend_row_indices[0, 0].tolist() == [[4, 4], [1, 3], [2, 3], [4, 4]]
    assert torch.equal(M.prefix_lm_causal_mask(4, torch.tensor(2)).startend_row_indices,
                       M.prefix_lm_causal_mask(4, 2).startend_row_indices)
