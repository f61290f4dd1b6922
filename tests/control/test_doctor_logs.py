"""Log diagnosis over SGLang-format excerpts (real message formats, prefixes, colours, tracebacks, ranks) and
real logs of the bundled runtime (runtime_*.log captured from `python -m runtime`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridctl.doctor.log_findings import log_findings
from hybridctl.doctor.log_patterns import PATTERNS
from hybridctl.doctor.log_scan import clean_line, scan_log, startup_summary
from hybridctl.doctor.remedies import RemedyInput

LOGS = Path(__file__).parent / "data" / "logs"


def diagnose(name: str) -> list:
    with open(LOGS / name, encoding="utf-8") as fh:
        return log_findings(scan_log(fh), RemedyInput(None))


# file -> [(code, severity, line)] in order of line
EXPECTED = {
    "sglang_mamba_alloc_tp2.log": [("MAMBA_POOL_ALLOC", "error", 25)],
    "sglang_state_too_small.log": [("MAMBA_POOL_ALLOC", "warning", 2), ("MAMBA_POOL_ALLOC", "error", 8)],
    "sglang_no_state_memory.log": [("MAMBA_POOL_ALLOC", "error", 5)],
    "sglang_ping_pong.log": [("MAMBA_POOL_ALLOC", "error", 19)],
    "sglang_zero_state_pool.log": [("MAMBA_POOL_ALLOC", "error", 8)],
    "sglang_no_buffer_page.log": [("PREFIX_CACHE_MISS", "error", 7)],
    "sglang_radix_disabled.log": [("RADIX_CACHE_OFF", "info", 1)],  # a choice, not a failure
    "sglang_spec_track_interval.log": [("SPEC_ROLLBACK", "error", 5)],
    "sglang_spec_topk.log": [("SPEC_ROLLBACK", "error", 5)],
    "sglang_elastic_vmm.log": [("ELASTIC_TIMEOUT", "warning", 2), ("ELASTIC_TIMEOUT", "error", 7)],
    "sglang_unified_too_small.log": [("ELASTIC_TIMEOUT", "error", 5)],
    "sglang_pd_slot_mismatch.log": [("PD_STATE_MISMATCH", "error", 6)],
    "sglang_pd_layouts.log": [("PD_STATE_MISMATCH", "error", 2)],
    "runtime_state_pool_too_small.log": [("MAMBA_POOL_ALLOC", "error", 2)],
    "runtime_snapshot_off.log": [("PREFIX_CACHE_MISS", "warning", 5)],
    "runtime_spec_rollback.log": [("SPEC_ROLLBACK", "error", 3)],
    "runtime_elastic_timeout.log": [("ELASTIC_TIMEOUT", "error", 1)],
    "runtime_pd_mismatch.log": [("PD_STATE_MISMATCH", "error", 1)],
    "runtime_no_state_memory.log": [("MAMBA_POOL_ALLOC", "error", 2)],
    "runtime_state_alloc_failed.log": [("MAMBA_POOL_ALLOC", "error", 2)],
    "sglang_extra_buffer_arch.log": [("PREFIX_CACHE_MISS", "error", 4)],
    "sglang_mtp_topk.log": [("SPEC_ROLLBACK", "error", 4)],
    "sglang_packed_draft.log": [("SPEC_ROLLBACK", "error", 4)],
    "sglang_vmm_map.log": [("ELASTIC_TIMEOUT", "error", 4)],
    "sglang_unified_pd_spec.log": [("ELASTIC_TIMEOUT", "error", 4)],
    "sglang_pd_lazy.log": [("PD_STATE_MISMATCH", "error", 4)],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_failure_log_gives_its_code(name: str) -> None:
    got = sorted(((f.code, f.severity, f.line) for f in diagnose(name)), key=lambda t: t[2])
    assert got == EXPECTED[name]


@pytest.mark.parametrize("name", ["sglang_healthy_tp2.log", "runtime_healthy.log"])
def test_healthy_logs_give_no_finding(name: str) -> None:
    assert diagnose(name) == []


def test_every_code_is_covered_by_a_log_excerpt() -> None:
    codes = {code for expected in EXPECTED.values() for code, sev, _ in expected if sev != "info"}
    assert codes == {
        "MAMBA_POOL_ALLOC",
        "PREFIX_CACHE_MISS",
        "SPEC_ROLLBACK",
        "ELASTIC_TIMEOUT",
        "PD_STATE_MISMATCH",
    }


def test_every_pattern_matches_an_excerpt() -> None:
    paths = [*LOGS.glob("*.log"), *(LOGS.parent / "doctor_logs").glob("*.log")]
    text = "\n".join(p.read_text(encoding="utf-8") for p in paths)
    plain = "\n".join(clean_line(line)[1] for line in text.splitlines())
    assert [p.id for p in PATTERNS if not p.regex.search(plain)] == []


def test_ranks_counted_once_with_evidence_from_the_error_line() -> None:
    (f,) = diagnose("sglang_mamba_alloc_tp2.log")
    assert f.count == 2 and "TP0, TP1" in f.cause
    assert f.evidence.startswith("AssertionError: Not enough space for mamba cache")


def test_without_a_config_the_slot_count_comes_from_the_log() -> None:
    (f,) = diagnose("sglang_mamba_alloc_tp2.log")  # max_running_requests=8, no_buffer: 3 slots each
    assert f.changes == () and re.search(r"needs (?:the server's )?--max-mamba-cache-size 24\b", f.fix)
    (g,) = diagnose("sglang_zero_state_pool.log")  # a 0-slot pool caps requests at 0: plan for two
    assert re.search(r"needs (?:the server's )?--max-mamba-cache-size 6\b", g.fix)


def test_colours_are_stripped_from_evidence() -> None:
    (f,) = diagnose("sglang_ping_pong.log")
    assert "\x1b" not in f.evidence and f.evidence.endswith("--mamba-full-memory-ratio.")


def test_traceback_source_line_is_evidence_only_when_nothing_better() -> None:
    (f,) = diagnose("sglang_spec_track_interval.log")
    assert "assert view.mamba_track_interval >= view.speculative_num_draft_tokens" in f.evidence
    (g,) = diagnose("sglang_no_buffer_page.log")
    assert g.evidence == "AssertionError: no_buffer only supports page_size=1." and g.count == 1


def test_startup_numbers() -> None:
    with open(LOGS / "sglang_healthy_tp2.log", encoding="utf-8") as fh:
        scan = scan_log(fh)
    assert startup_summary(scan.startup) == {
        "max_mamba_cache_size": 764, "kv_tokens": 1245184, "max_running_requests": 254,
    }  # fmt: skip
    assert scan.prefill_batches == 3 and scan.cached_tokens == 2048
    with open(LOGS / "runtime_healthy.log", encoding="utf-8") as fh:
        st_rt = startup_summary(scan_log(fh).startup)
    assert st_rt["max_mamba_cache_size"] and st_rt["kv_tokens"] and st_rt["max_running_requests"]


def test_no_hits_over_many_prefills_is_info_only() -> None:
    lines = [
        f"[2026-03-02 13:1{i}:00 TP0] Prefill batch, #new-seq: 1, #new-token: {100 + i}, #cached-token: 0, "
        "full token usage: 0.01, mamba usage: 0.01, #running-req: 0, #queue-req: 0"
        for i in range(4)
    ]
    (f,) = log_findings(scan_log(lines), RemedyInput(None))
    assert (f.code, f.severity, f.line) == ("PREFIX_CACHE_IDLE", "info", 1)
    assert log_findings(scan_log(lines[:2]), RemedyInput(None)) == []


_PREFIXES = st.sampled_from(
    ["", "[2026-03-02 10:02:17] ", "[2026-03-02 10:02:17 TP3] ", "[2026-03-02 10:02:17.123 DP1 TP0] "]
)
_COLOURS = st.sampled_from([("", ""), ("\x1b[31m", "\x1b[0m"), ("\x1b[1;33m", "\x1b[0m")])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix=_PREFIXES,
    colour=_COLOURS,
    noise=st.lists(st.text(alphabet="abc xyz=,.:", max_size=40), max_size=5),
)
def test_decoration_does_not_change_the_diagnosis(
    prefix: str, colour: tuple[str, str], noise: list[str]
) -> None:
    base = (LOGS / "sglang_mamba_alloc_tp2.log").read_text(encoding="utf-8").splitlines()
    decorated = [
        *noise,
        *(prefix + colour[0] + re.sub(r"^\[[^\]]*\] ", "", line) + colour[1] for line in base),
    ]
    findings = log_findings(scan_log(decorated), RemedyInput(None))
    assert [f.code for f in findings] == ["MAMBA_POOL_ALLOC"]
    assert findings[0].line == len(noise) + 25


def test_every_pattern_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "failure-modes.md").read_text(encoding="utf-8")
    assert [p.id for p in PATTERNS if f"`{p.id}`" not in doc] == []
