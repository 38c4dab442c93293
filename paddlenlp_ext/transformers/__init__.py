"""Models (Hugging Face parameter names, FlashMask attention), auto classes and the embedded default model.

Counterpart of ``paddlenlp.transformers``: ``LlamaForCausalLM`` / ``LlamaModel`` / ``LlamaConfig``,
``AutoModelForCausalLM`` and ``AutoTokenizer`` (local directories or the embedded SmolLM2-135M-Instruct only).
"""

from .auto import AutoConfig, AutoModelForCausalLM, AutoTokenizer, resolve_model_name_or_path
from .llama import LlamaConfig, LlamaForCausalLM, LlamaModel

__all__ = ["AutoConfig", "AutoModelForCausalLM", "AutoTokenizer", "LlamaConfig", "LlamaForCausalLM",
           "LlamaModel", "resolve_model_name_or_path"]
