"""Pretraining data: token files in PaddleNLP's and Megatron-LM's formats, PaddleNLP's sample index, blends and
document masks.

- ``indexed``: :class:`IndexedTokens` reads ``<prefix>.bin``/``.idx`` and ``<prefix>_ids.npy``/``_idx.npz``
  memory-mapped; :class:`IndexedTokensWriter` writes them atomically.
- ``index``: the split, epoch, document / sample / shuffle index and blending algorithms (numpy).
- ``dataset``: :class:`GPTDataset`, :class:`BlendableDataset`, the index cache,
  :func:`build_train_valid_test_datasets`.
- ``collate``: :class:`PretrainingCollator` (``reset_attention_mask``, ``reset_position_ids``, ``eod_mask_loss``).
"""

from .collate import PretrainingCollator, document_layout
from .dataset import (BlendableDataset, GPTDataset, build_split_dataset, build_train_valid_test_datasets,
                      cached_index, data_prefixes, index_description)
from .index import (SampleIndex, blend_num_samples, blending_indices, build_doc_idx, build_index, build_sample_idx,
                    build_shuffle_idx, num_epochs, parse_split, separate_last_epoch, split_bounds)
from .indexed import CorpusError, IndexedTokens, IndexedTokensWriter, read_meta, token_dtype, write_corpus, write_index

__all__ = [
    "BlendableDataset", "CorpusError", "GPTDataset", "IndexedTokens", "IndexedTokensWriter", "PretrainingCollator",
    "SampleIndex", "blend_num_samples", "blending_indices", "build_doc_idx", "build_index", "build_sample_idx",
    "build_shuffle_idx", "build_split_dataset", "build_train_valid_test_datasets", "cached_index", "data_prefixes",
    "document_layout", "index_description", "num_epochs", "parse_split", "read_meta", "separate_last_epoch",
    "split_bounds", "token_dtype", "write_corpus", "write_index",
]
