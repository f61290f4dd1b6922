"""Byte sizes of the dtype names that appear in HF configs and SGLang flags."""

from __future__ import annotations

# SGLang's --kv-cache-dtype and --mamba-ssm-dtype spellings plus HF's torch_dtype spellings.
_DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e4m3": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e5m2": 1,
    "fp8": 1,
}

# What --mamba-ssm-dtype accepts (configs/mamba_utils.py:63 dtype_map).
SSM_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


def dtype_bytes(name: str) -> int:
    """Bytes per element of `name`; ValueError naming the accepted spellings when unknown."""
    key = name.strip().lower()
    if key not in _DTYPE_BYTES:
        accepted = ", ".join(sorted(_DTYPE_BYTES))
        raise ValueError(f"unknown dtype {name!r}; accepted: {accepted}")
    return _DTYPE_BYTES[key]


def canonical_dtype(name: str) -> str:
    """The long spelling (bf16 -> bfloat16) so reports show one name per dtype."""
    key = name.strip().lower()
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    dtype_bytes(key)
    return aliases.get(key, key)
