"""Model knowledge: a hybrid model's HF config.json -> layers, state and KV bytes, weights (no torch)."""

from hybridctl.model.errors import ModelSpecError
from hybridctl.model.families import SUPPORTED_FAMILIES
from hybridctl.model.spec import ModelSpec, load_model_spec

__all__ = ["SUPPORTED_FAMILIES", "ModelSpec", "ModelSpecError", "load_model_spec"]
