"""Parse the start-up lines of an SGLang (or bundled runtime) log: the two pools, the limits, the tree cache.

The patterns follow SGLang 0.5.23's own f-strings (mem_cache/memory_pool.py "Mamba Cache is allocated. ...",
"KV Cache is allocated. ...", managers/scheduler.py "max_total_num_tokens=...", mem_cache/registry.py
"Tree cache initialized: ...", entrypoints/http_server.py "The server is fired up and ready to roll!"), which
the bundled runtime prints verbatim. Prefixes (timestamps, "[TP0]") are ignored: patterns match anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

READY_LINE = "The server is fired up and ready to roll!"

_MAMBA = re.compile(
    r"Mamba Cache is allocated\. max_mamba_cache_size: (?P<slots>\d+), "
    r"conv_state size: (?P<conv>[\d.]+) ?GB, ssm_state size: (?P<ssm>[\d.]+) ?GB"
    r"(?: intermediate_ssm_state_cache size: (?P<inter>[\d.]+) ?GB)?"
)
_KV = re.compile(
    r"(?:(?P<label>[\w-]+) )?KV Cache is allocated\. dtype: (?P<dtype>[\w.]+), #tokens: (?P<tokens>\d+), "
    r"(?:K size: (?P<k>[\d.]+) ?GB, V size: (?P<v>[\d.]+) ?GB|KV size: (?P<kv>[\d.]+) ?GB)"
)
_LIMITS = re.compile(r"max_total_num_tokens=(?P<total>\d+), chunked_prefill_size=(?P<chunk>-?\d+|None)")
_KEYVAL = re.compile(r"(\w+)=([^,\s]+)")
_TREE = re.compile(
    r"Tree cache initialized: source=(?P<source>\S+) impl=(?P<impl>\S+) hybrid_swa=(?P<swa>\w+) "
    r"hybrid_ssm=(?P<ssm>\w+)"
)


@dataclass
class MambaPoolLine:
    max_mamba_cache_size: int
    conv_state_gb: float
    ssm_state_gb: float
    intermediate_ssm_state_gb: float | None = None


@dataclass
class KVPoolLine:
    dtype: str
    tokens: int
    size_gb: float  # K + V
    label: str | None = None  # "SWA", "Full", ... for hybrid-SWA pools; None for the plain pool


@dataclass
class StartupInfo:
    """What one server's start-up log says; None: the line was not (yet) in the log."""

    mamba: MambaPoolLine | None = None
    kv: list[KVPoolLine] = field(default_factory=list)
    max_total_num_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    available_mem_gb: float | None = None
    tree_cache_impl: str | None = None
    hybrid_ssm: bool | None = None
    ready: bool = False
    pool_lines: list[str] = field(default_factory=list)  # the raw lines, for display

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and re.fullmatch(r"-?\d+", text) else None


def _strip(line: str) -> str:
    return line.rstrip("\r\n")


def parse_startup(lines: Iterable[str]) -> StartupInfo:
    info = StartupInfo()
    for raw in lines:
        line = _strip(raw)
        if m := _MAMBA.search(line):
            inter = m.group("inter")
            info.mamba = MambaPoolLine(
                int(m.group("slots")), float(m.group("conv")), float(m.group("ssm")),
                float(inter) if inter is not None else None,
            )  # fmt: skip
            info.pool_lines.append(line[m.start() :])
        elif m := _KV.search(line):
            size = float(m.group("kv")) if m.group("kv") else float(m.group("k")) + float(m.group("v"))
            info.kv.append(KVPoolLine(m.group("dtype"), int(m.group("tokens")), size, m.group("label")))
            info.pool_lines.append(line[m.start() :])
        elif m := _LIMITS.search(line):
            values = dict(_KEYVAL.findall(line[m.start() :]))
            info.max_total_num_tokens = _int(values.get("max_total_num_tokens"))
            info.chunked_prefill_size = _int(values.get("chunked_prefill_size"))
            info.max_prefill_tokens = _int(values.get("max_prefill_tokens"))
            info.max_running_requests = _int(values.get("max_running_requests"))
            info.context_len = _int(values.get("context_len"))
            mem = re.search(r"available_(?:gpu|cpu)_mem=([\d.]+) ?GB", line)
            info.available_mem_gb = float(mem.group(1)) if mem else None
            info.pool_lines.append(line[m.start() :])
        elif m := _TREE.search(line):
            info.tree_cache_impl = m.group("impl")
            info.hybrid_ssm = m.group("ssm") == "True"
            info.pool_lines.append(line[m.start() :])
        elif READY_LINE in line:
            info.ready = True
    return info


def parse_startup_text(text: str) -> StartupInfo:
    return parse_startup(text.splitlines())
