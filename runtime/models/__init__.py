"""Model code for the bundled runtime: our own layers, HF checkpoint loading, one class per architecture."""

from runtime.models.base import HybridModel
from runtime.models.errors import ModelLoadError
from runtime.models.loader import load_model

__all__ = ["HybridModel", "ModelLoadError", "load_model"]
