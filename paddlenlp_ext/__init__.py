"""paddlenlp_ext: PaddleNLP's FlashMask fine-tuning stack (SFT, LoRA, DPO, RM) rebuilt on PyTorch.

Subpackages mirror PaddleNLP: ``transformers`` (models), ``datasets`` (tokenisation and ZeroPadding packing),
``trainer`` (arguments, loop, checkpoints), ``trl`` (DPO, reward model), ``peft`` (LoRA),
``distributed`` (FSDP2 / tensor parallel), and ``ops`` (fused training ops: chunked linear cross entropy,
RMSNorm, RoPE, SwiGLU).
"""

__version__ = "0.1.0"
