"""Llama (Llama-2/3, SmolLM2): configuration and PyTorch model with Hugging Face parameter names."""

from .configuration import LlamaConfig
from .modeling import LlamaForCausalLM, LlamaModel

__all__ = ["LlamaConfig", "LlamaForCausalLM", "LlamaModel"]
