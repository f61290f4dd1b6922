"""The one error type for model-config problems (rendered as a one-paragraph message, never a traceback)."""

from __future__ import annotations


class ModelShapeError(ValueError):
    """A config.json that is missing, unreadable, not a supported hybrid, or inconsistent.

    The message names the file, the key and what to do about it.
    """
