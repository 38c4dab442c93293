"""transformers."""
