"""Static key/value cache for incremental decoding (inference only; training never passes one)."""

from __future__ import annotations

import torch


class KVCache:
    """Preallocated per-layer K/V buffers ``[B, max_len, H_k, D]`` (the FlashMask layout).

    Use: a prefill call writes the prompt (``seen == 0``, any length), then one token per call. The model's
    layers call :meth:`update`; the model calls :meth:`advance` once per forward.

    Args:
        num_layers, batch_size, max_len, num_kv_heads, head_dim: buffer geometry.
        dtype, device: those of the model's activations.
    """

    def __init__(self, num_layers: int, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (batch_size, max_len, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.seen = 0  # tokens already stored (= position of the next token)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v [B, L, H_k, D]`` after the ``seen`` cached tokens; return all keys/values so far.

        Raises:
            ValueError: the cache would overflow ``max_len``, or several tokens are appended to a non-empty
                cache (causal attention of a chunk against a cache is not supported by the FlashMask API).
        """
        n = k.shape[1]
        if self.seen + n > self.max_len:
            raise ValueError(f"KVCache overflow: {self.seen} cached + {n} new > max_len={self.max_len}")
        if self.seen and n != 1:
            raise ValueError(f"KVCache: after the prefill, feed one token per call (got {n})")
        self.k[layer_idx][:, self.seen:self.seen + n] = k
        self.v[layer_idx][:, self.seen:self.seen + n] = v
        return self.k[layer_idx][:, :self.seen + n], self.v[layer_idx][:, :self.seen + n]

    def advance(self, n: int) -> None:
        """Mark ``n`` more tokens as stored (called by the model after all layers ran)."""
        self.seen += n
