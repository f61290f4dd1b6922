"""Byte units as SGLang counts them (GiB = 2**30; it does its pool arithmetic in such GB) and how every report
shows numbers to people.

One style across commands: memory in binary units (GiB, MiB; SGLang's logged "GB" are GiB), fractions as
percentages with one decimal, times in ms below a second and in s above, whole numbers without ".0", an unset
value in words ("not set", "no limit"), and config values spelled as in the files (true, "text", not Python's
True / 'text'). `--json` output never goes through these: it keeps the raw values.
"""

from __future__ import annotations

import json
import math

GIB = 1 << 30
MIB = 1 << 20
# The largest memory size (GiB) a flag or a config key may give: 1 PiB, past any device or host there is. Without a
# bound `inf` or 1e300 reach the byte arithmetic, which needs integers.
MAX_MEMORY_GIB = 1 << 20
# The largest byte count a flag may give (--pool-bytes): the same 1 PiB.
MAX_MEMORY_BYTES = MAX_MEMORY_GIB * GIB


def format_gib(n_bytes: int | float, digits: int = 1, *, trim: bool = False) -> str:
    """`n_bytes` as "12.3 GiB" (`digits` decimals); `trim`: a whole number without decimals ("80 GiB")."""
    text = f"{n_bytes / GIB:.{digits}f}"
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} GiB"


def format_mib(n_bytes: int | float, digits: int = 2) -> str:
    """`n_bytes` as "1.25 MiB" (`digits` decimals)."""
    return f"{n_bytes / MIB:.{digits}f} MiB"


def format_number(value: float | None, none: str = "not set", digits: int = 2) -> str:
    """A count or measure as people write it: 8.0 -> "8", 0.8500 -> "0.85", 137.925 -> "137.93" (at most
    `digits` decimals); None -> `none`; an infinite value -> "no limit"."""
    if value is None:
        return none
    if isinstance(value, bool):  # a bool is an int; spell it as the config files do
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isinf(value):
            return "no limit"
        if math.isnan(value):
            return "n/a"
        text = f"{value:.{digits}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return str(value)


def format_limit(value: float | None) -> str:
    """A cap that may be absent: None, 0 or infinity -> "no limit", else the number ("8")."""
    if value is None or value == 0 or (isinstance(value, float) and math.isinf(value)):
        return "no limit"
    return format_number(value)


def format_percent(fraction: float | None, digits: int = 1) -> str:
    """A fraction (0.7778) as "77.8%"; None -> "n/a"."""
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return "n/a"
    return f"{fraction:.{digits}%}"


def format_ms(ms: float | None) -> str:
    """A duration given in ms at a precision people read: "0.42 ms", "4.2 ms", "138 ms", "1.4 s", "95 s";
    None -> "n/a"."""
    if ms is None or math.isnan(ms):
        return "n/a"
    if ms < 1:
        return f"{ms:.2f} ms"
    if ms < 9.95:  # what rounds to 10.0 reads as "10 ms"
        return f"{ms:.1f}".removesuffix(".0") + " ms"
    if ms < 999.5:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    return (f"{seconds:.1f}".removesuffix(".0") if seconds < 99.95 else f"{seconds:.0f}") + " s"


def format_value(value: object) -> str:
    """A config or server value spelled as in config.toml and settings.json (JSON's spelling, which TOML shares
    for strings, numbers and booleans): true, "fcfs", 0.85, [1, 2]; None -> null."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def with_article(phrase: str) -> str:
    """`phrase` after "a" or "an" as it is spoken: "an 80 GiB GPU", "an 11 GiB GPU", "a 24 GiB GPU"."""
    digits = phrase.split(".", 1)[0].split(" ", 1)[0]
    if digits.isdigit():
        # eight..., eighteen, eleven (and 11/18 thousand, million) start with a vowel sound
        vowel = digits.startswith("8") or (digits[:2] in ("11", "18") and len(digits) % 3 == 2)
    else:
        vowel = phrase[:1].lower() in "aeio"
    return f"{'an' if vowel else 'a'} {phrase}"


def plural(n: int, noun: str) -> str:
    """`1 error`, `2 errors`, `0 warnings`: counts in words, not `error(s)`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
