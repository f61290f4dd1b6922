"""The argparse types of `python -m runtime`'s flags (hybridshared/flags/runtime_args.py): SGLang's integer syntax
for token counts, the ranges a count or fraction must be in, and --decoding-step-tokens' "auto"."""

from __future__ import annotations

import argparse
import re
from decimal import Decimal

AUTO = "auto"


def human_readable_int(value: str) -> int:
    """SGLang's integer syntax for token counts: 4096, 25.6k, 1M (SI) or 8Ki (IEC)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
        si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(f"decimals are not allowed with IEC suffixes like '{suffix}'")
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {value!r} (examples: 4096, 32k, 8Ki)") from None


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {number}")
    return number


def fraction(value: str) -> float:
    number = float(value)
    if not 0.0 < number < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {number}")
    return number


def positive_float(value: str) -> float:
    number = float(value)
    if not number > 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {number}")
    return number


def step_tokens(value: str) -> int | str:
    """--decoding-step-tokens: "auto" or a token count (checked in runtime_parser._check_values)."""
    return AUTO if value.strip().lower() == AUTO else human_readable_int(value)
