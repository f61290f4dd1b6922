"""Errors the loader raises; each message names the file, the key or tensor, and the fix."""

from __future__ import annotations


class ModelLoadError(Exception):
    """A model directory that cannot be loaded: bad config.json, missing/unexpected tensors, bad shapes."""
