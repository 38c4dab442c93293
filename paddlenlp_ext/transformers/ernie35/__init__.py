"""ERNIE-3.5-SE (PaddleNLP ``llm/experimental/ernie-3.5-se``) with FlashMask packing.

``model_type`` is ``"ernie"``. ``from_preset_or_pretrained("ernie/tiny-random-ernie")`` builds the tiny preset
with random weights (no ERNIE-3.5-SE weights exist in any reachable registry); a directory loads our safetensors
or a PaddleNLP checkpoint (``model_state.pdparams`` via a restricted unpickler, or Paddle safetensors).
Tokenizer: :class:`Ernie35Tokenizer` (SentencePiece BPE, PaddleNLP's ``ernie-tokenizer/`` layout); the presets load a
bundled 4,096-piece model trained on the bundled data (``data/build_ernie_tokenizer.py``).
"""

from .configuration import ERNIE_PRETRAINED_INIT_CONFIGURATION, Ernie35Config
from .modeling import (
    Ernie35Attention,
    Ernie35DecoderLayer,
    Ernie35ForCausalLM,
    Ernie35MLP,
    Ernie35MLPAttention,
    Ernie35Model,
    count_parameters_formula,
    from_preset_or_pretrained,
    is_preset,
    preset_config,
)
from .paddle_import import RestrictedUnpickler, UnsafePickleError, load_pdparams, save_paddle_checkpoint
from .tokenizer import BUNDLED_TOKENIZER_DIR, Ernie35Tokenizer, load_ernie_tokenizer

__all__ = [
    "ERNIE_PRETRAINED_INIT_CONFIGURATION",
    "Ernie35Config",
    "Ernie35Attention",
    "Ernie35DecoderLayer",
    "Ernie35ForCausalLM",
    "Ernie35MLP",
    "Ernie35MLPAttention",
    "Ernie35Model",
    "BUNDLED_TOKENIZER_DIR",
    "Ernie35Tokenizer",
    "load_ernie_tokenizer",
    "count_parameters_formula",
    "from_preset_or_pretrained",
    "is_preset",
    "preset_config",
    "RestrictedUnpickler",
    "UnsafePickleError",
    "load_pdparams",
    "save_paddle_checkpoint",
]
