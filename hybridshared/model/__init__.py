"""A hybrid model's HF config.json -> layers, state and KV bytes, weights (no torch)."""
