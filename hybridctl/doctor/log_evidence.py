"""What a log finding rests on, and the checks a finding must pass besides its message.

A message decides nothing alone. Each finding states its evidence (`DoctorFinding.basis`, `basis` in `--json`):
the message family or signature that fits, the exception type, the frames it passed through, the model (does it
carry recurrent state at all?), the release and flag spelling the fix is written in, and, for a warning whose
effect shows later, what the log shows after it. Two checks can take a finding back:

- the model: the five codes are about recurrent state; a log from a model without any (GPT-OSS, Llama, a
  sliding-window hybrid) gets none of them, whatever its messages say. A crash there is UNKNOWN_FAILURE, and the
  finding says which code its message resembled and why it was not assigned.
- what follows a warning: "skip Mamba state checkpoints" is a prefix-cache miss only if the prefills after it
  cache nothing; a later cache hit takes it back.
"""

from __future__ import annotations

import re
from dataclasses import replace

from hybridctl.doctor.findings import CODES, DoctorFinding
from hybridctl.doctor.log_families import FamilyMatch, match_family
from hybridctl.doctor.log_scan import LogScan
from hybridctl.doctor.log_traceback import Traceback

# Warnings that predict a failure instead of reporting one: kept only when the log after them confirms it.
PRECURSORS = frozenset({"sglang_checkpoint_skip"})
# Where a server builds, resizes, pauses or resumes its memory pools (frames), or what such a failure says.
_POOL_SETUP = re.compile(
    r"init_memory_pool|_init_pools|memory_pool|token_to_kv_pool|req_to_token_pool|KVPool|MambaPool|kv_cache"
    r"|alloc\w*|resume_memory_occupation|release_memory_occupation|page_allocator|map_pages",
    re.IGNORECASE,
)
_POOL_WORDS = re.compile(r"memory|\bpool\b|kv cache|cache type|\bpages?\b|attention type|hybrid", re.IGNORECASE)


def frames_text(tb: Traceback) -> str:
    """The frames' modules and functions (not the source lines under them: a source line is code, not place)."""
    return " ".join(f"{f.module}.{f.func}" for f in tb.frames)


def traceback_basis(tb: Traceback) -> list[str]:
    out = [f"exception: {tb.exc_type or 'none logged'}"]
    frames = [f"{f.module}.{f.func}" for f in tb.frames if f.func][-3:]
    if frames:
        out.append("frames: " + " -> ".join(frames))
    return out


def context_basis(scan: LogScan) -> list[str]:
    """The model and the release: the same for every finding of one log."""
    out = [scan.model.describe()]
    dialect = scan.dialect
    if dialect.version or dialect.strategy_flag:
        release = f"SGLang {dialect.version}" if dialect.version else "release not printed"
        out.append(f"release: {release}; strategy flag spelled {dialect.strategy()}")
    return out


def family_of(tb: Traceback) -> FamilyMatch | None:
    return match_family(f"{tb.exc_type}: {tb.message}", frames_text(tb))


def plugin_stack(tb: Traceback, scan: LogScan) -> str | None:
    """An elastic-memory stack (kvcached, torch_memory_saver, unified memory) active before a crash in the
    memory pools' set-up: the stack's failure even when its own frames and words are absent from the traceback."""
    active = [(line, name) for name, line in scan.plugins.items() if line <= tb.end]
    if not active or not tb.fatal or not tb.exc_type:
        return None
    if not (_POOL_SETUP.search(frames_text(tb)) or _POOL_WORDS.search(tb.message)):
        return None
    line, name = min(active)
    return f"plugin stack: {name} active (line {line}); the crash is in the memory pools' set-up"


def gate_by_model(found: list[DoctorFinding], scan: LogScan) -> tuple[list[DoctorFinding], list[DoctorFinding]]:
    """(kept, withdrawn): a model known to carry no recurrent state withdraws every finding of the five codes."""
    if scan.model.recurrent is not False:
        return found, []
    kept = [f for f in found if f.code not in CODES]
    return kept, [f for f in found if f.code in CODES]


def confirm_precursors(found: list[DoctorFinding], scan: LogScan, precursor_lines: set[int]) -> list[DoctorFinding]:
    """A warning that predicts a miss stays only when the prefills after it cache nothing."""
    out = []
    for f in found:
        if f.line not in precursor_lines:
            out.append(f)
            continue
        after = [cached for line, cached in scan.prefills if line > (f.line or 0)]
        if any(after):
            continue  # later prefixes were served from the cache: the skipped checkpoints did not matter
        seen = (
            f"after the warning: {len(after)} prefills, 0 cached tokens"
            if after
            else "after the warning: no prefill logged yet (the setting skips checkpoints for every such prefix)"
        )
        chunk = re.search(r"mamba_cache_chunk_size\W+(\d+)", f.evidence or "")
        size = chunk.group(1) if chunk else "the size the warning names"
        fix = (
            f"Raise runtime.chunked_prefill_size (the server's --chunked-prefill-size) to at least "
            f"mamba_cache_chunk_size ({size}) so every chunk hand-off lands on a state checkpoint, or use "
            'cache.mamba_radix_cache_strategy = "no_buffer" with cache.radix_cache_page_size = 1.'
        )
        out.append(replace(f, fix=fix, basis=(*f.basis, seen)))
    return out


def withheld_reason(tb: Traceback, scan: LogScan, withdrawn: list[DoctorFinding]) -> tuple[str | None, str]:
    """For a crash none of the five explains: (nearest code, why it was not assigned)."""
    near = [f for f in withdrawn if f.line is not None and tb.start - 2 <= f.line <= tb.end + 2]
    fam = family_of(tb)
    stateless = scan.model.recurrent is False
    if near or (stateless and fam is not None and fam.full):
        code = near[0].code if near else fam.family.code if fam else ""
        return code, f"not assigned: {scan.model.why()}, and the five codes concern recurrent state"
    if fam is None:
        return None, ""
    return fam.family.code, (
        f"its words fit {fam.describe()} but not assigned: the message names no {' and no '.join(fam.missing)}"
    )
