"""``worker.py`` scenarios on tiny random ``transformers`` models (``HFCausalLM``, FlashMask backend): the scenario's
``model`` names a family of ``tests/_hf_tiny.py`` (``qwen2``: sliding layers; ``mistral``: a window on every layer).

``python -m torch.distributed.run --nproc_per_node N tests/distributed/hf_worker.py SPEC.json OUT.json``.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]  # worker.py, and the repository root (tests._hf_tiny)

import worker  # noqa: E402


def build_hf_model(tied: bool, kind: str = "qwen2", vocab: int = 128):
    """The family's tiny model (hidden 32, 4 heads, 2 KV heads, windows of 3-4 tokens), identical on every rank."""
    from paddlenlp_ext.transformers.hf_causal_lm import HFCausalLM
    from tests._hf_tiny import tiny_model

    return HFCausalLM(tiny_model(kind, "FlashMask", vocab_size=vocab, tie_word_embeddings=tied,
                                 intermediate_size=64)).train()


worker.build_model = build_hf_model

if __name__ == "__main__":
    worker.main(sys.argv[1], sys.argv[2])
