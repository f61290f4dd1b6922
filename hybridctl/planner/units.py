"""Byte units as SGLang counts them (GiB = 2**30; it does its pool arithmetic in such GB) and how reports show them."""

from __future__ import annotations

GIB = 1 << 30
MIB = 1 << 20


def format_gib(n_bytes: int | float, digits: int = 1) -> str:
    """`n_bytes` as "12.3 GiB" (`digits` decimals)."""
    return f"{n_bytes / GIB:.{digits}f} GiB"


def format_mib(n_bytes: int | float, digits: int = 2) -> str:
    """`n_bytes` as "1.25 MiB" (`digits` decimals)."""
    return f"{n_bytes / MIB:.{digits}f} MiB"
