"""Layer building blocks shared by the model classes (pure torch, no transformers)."""
