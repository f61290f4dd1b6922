"""Which SGLang a log came from, and how that release spells the flags a fix names.

SGLang renamed `--mamba-scheduler-strategy` to `--mamba-radix-cache-strategy` (issue sgl-project/sglang#27418,
0.5.1x); a user on an older release must be answered with the spelling their server accepts. The log tells us
by itself when it logged its server_args or its launch command (the spelling it used wins), else by the
version it printed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_VERSION = re.compile(
    r"(?:sglang(?:==|[ _-]?version[=: ]+|\s+v?|:v|-v)|\"version\":\s*\")(?P<v>0\.\d+\.\d+(?:\.post\d+|rc\d+)?)",
    re.IGNORECASE,
)
# First release whose server_args spell it mamba_radix_cache_strategy (the old spelling before it).
RENAMED_IN = (0, 5, 15)
OLD_STRATEGY_FLAG = "--mamba-scheduler-strategy"
NEW_STRATEGY_FLAG = "--mamba-radix-cache-strategy"


@dataclass
class LogDialect:
    version: str | None = None  # "0.5.6" as the log printed it
    strategy_flag: str | None = None  # the strategy flag spelling the log itself used

    def version_tuple(self) -> tuple[int, ...] | None:
        if self.version is None:
            return None
        return tuple(int(x) for x in re.findall(r"\d+", self.version)[:3])

    def strategy(self) -> str:
        """The strategy flag this server accepts (the new spelling when the log says nothing)."""
        if self.strategy_flag:
            return self.strategy_flag
        v = self.version_tuple()
        return OLD_STRATEGY_FLAG if v is not None and v < RENAMED_IN else NEW_STRATEGY_FLAG

    def describe(self) -> str:
        return f"SGLang {self.version}" if self.version else "this server"


def read_dialect(lines: Iterable[str]) -> LogDialect:
    d = LogDialect()
    for line in lines:
        if d.version is None and (m := _VERSION.search(line)):
            d.version = m.group("v")
        if d.strategy_flag is None:
            if "mamba_scheduler_strategy" in line or OLD_STRATEGY_FLAG in line:
                d.strategy_flag = OLD_STRATEGY_FLAG
            elif "mamba_radix_cache_strategy" in line or NEW_STRATEGY_FLAG in line:
                d.strategy_flag = NEW_STRATEGY_FLAG
    return d
