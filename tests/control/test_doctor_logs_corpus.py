"""`doctor --log` over the corpus of real-format logs (tests/control/data/doctor_logs, manifest.toml): excerpts of
public SGLang issues, messages of several releases' source (0.4.10 ... 0.5.23), plugins (kvcached,
torch_memory_saver, NIXL, Mooncake, HiCache, NPU/ROCm builds) and the seed article's own five messages.

The accuracy test prints a per-code table; a log counts as correct when the distinct failure codes doctor reports,
in log order, equal the manifest's list exactly (healthy logs: none of the five codes, no UNKNOWN_FAILURE).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
import tomlkit  # not tomllib: Python 3.10 is supported and has none

from hybridctl.config.schema import HybridConfig
from hybridctl.doctor.findings import CODES, DoctorFinding
from hybridctl.doctor.log_findings import RADIX_CACHE_OFF, UNKNOWN_FAILURE, log_findings
from hybridctl.doctor.log_patterns import PATTERNS
from hybridctl.doctor.log_scan import scan_log
from hybridctl.doctor.remedies import RemedyInput

CORPUS = Path(__file__).parent / "data" / "doctor_logs"
MANIFEST: dict[str, dict] = tomlkit.parse((CORPUS / "manifest.toml").read_text(encoding="utf-8")).unwrap()
REPORTED = (*CODES, UNKNOWN_FAILURE)
BAR = 0.95
CV_BAR = 0.8  # with the patterns fit to a source dropped, families and signatures must still carry most


def diagnose_lines(lines: list[str], cfg: HybridConfig | None = None) -> list[DoctorFinding]:
    return log_findings(scan_log(lines), RemedyInput(cfg))


def diagnose(name: str) -> list[DoctorFinding]:
    return diagnose_lines((CORPUS / f"{name}.log").read_text(encoding="utf-8").splitlines())


def codes_of(findings: list[DoctorFinding]) -> list[str]:
    """Distinct reported codes in the order the log first shows them (first cause first)."""
    return list(dict.fromkeys(f.code for f in findings if f.code in REPORTED))


def fold_of(provenance: str) -> str:
    """The source a log came from: an issue thread, one release's source, the seed article."""
    release = re.search(r"sglang==(\d+\.\d+)\.(\d+)", provenance)
    if release and not provenance.startswith("built around http"):
        minor = int(release.group(2))
        return f"release {release.group(1)}.{minor if minor < 10 else f'{minor // 10}x'}"
    if "github.com/" in provenance:
        return "issue threads"
    if provenance.startswith("article"):
        return "article"
    return "other (described)"


def test_manifest_and_files_agree_and_cover_every_family() -> None:
    files = {p.stem for p in CORPUS.glob("*.log")}
    assert files == set(MANIFEST), "every log has a manifest entry and every entry a log"
    per_code: dict[str, int] = defaultdict(int)
    held_out: dict[str, int] = defaultdict(int)
    for name, entry in MANIFEST.items():
        assert entry["provenance"].strip(), name
        assert set(entry["codes"]) <= set(REPORTED), name
        assert entry.get("split", "dev") in ("dev", "held_out"), name
        for code in entry["codes"]:
            per_code[code] += 1
            held_out[code] += entry.get("split") == "held_out"
        assert len((CORPUS / f"{name}.log").read_text(encoding="utf-8").splitlines()) <= 30, f"{name}: keep it short"
    assert {code: n for code, n in per_code.items() if n < 15} == {}
    assert set(per_code) == set(REPORTED)
    assert {code: n for code, n in held_out.items() if n < 4} == {} and set(held_out) == set(REPORTED)
    hard_negatives = [n for n, e in MANIFEST.items() if e.get("note", "").startswith("hard negative")]
    assert len(hard_negatives) >= 20
    assert all(set(MANIFEST[n]["codes"]) <= {UNKNOWN_FAILURE} for n in hard_negatives)
    assert len({fold_of(e["provenance"]) for e in MANIFEST.values()}) >= 6


def _accuracy(
    names: list[str], codes: Callable[[str], list[str]] | None = None, label: Callable[[str], str] = lambda n: n
) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """Per code: logs diagnosed right, logs in all, and each miss. `codes` diagnoses a log by name (default: as
    `doctor --log` does), `label` names a miss."""
    right: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    misses = []
    for name in names:
        entry = MANIFEST[name]
        got = codes(name) if codes is not None else codes_of(diagnose(name))
        for code in entry["codes"] or ["(healthy)"]:
            total[code] += 1
            right[code] += got == entry["codes"]
        if got != entry["codes"]:
            misses.append(f"{label(name)}: expected {entry['codes']}, got {got}")
    return right, total, misses


def _table(title: str, right: dict[str, int], total: dict[str, int]) -> None:
    print(f"\n{title}")
    for key in sorted(total):
        print(f"  {key:20s} {right[key]:3d}/{total[key]:<3d} {right[key] / total[key]:6.1%}")


def test_corpus_accuracy_per_code(capsys: pytest.CaptureFixture[str]) -> None:
    right, total, misses = _accuracy(sorted(MANIFEST))
    negatives = [n for n, e in MANIFEST.items() if set(e["codes"]) <= {UNKNOWN_FAILURE}]
    healthy_with_failure = [n for n in negatives if set(codes_of(diagnose(n))) & set(CODES)]
    with capsys.disabled():
        _table("doctor --log corpus accuracy (all logs):", right, total)
        correct = len(MANIFEST) - len(misses)
        print(f"  {'all logs':20s} {correct:3d}/{len(MANIFEST):<3d} {correct / len(MANIFEST):6.1%}")
    assert healthy_with_failure == [], "no failure code on a healthy log or a model without recurrent state"
    assert {c: right[c] / total[c] for c in total if right[c] / total[c] < BAR} == {}, "\n".join(misses)


def test_held_out_accuracy_per_code_and_per_source(capsys: pytest.CaptureFixture[str]) -> None:
    """The held-out logs were written after the message families and signatures, and not used to change them:
    their accuracy is the estimate of how `doctor --log` does on logs it has never seen. The whole corpus is also
    split by source (issue threads, each release's source), so a family that only fits one release shows."""
    held = sorted(n for n, e in MANIFEST.items() if e.get("split") == "held_out")
    dev = sorted(n for n, e in MANIFEST.items() if e.get("split", "dev") == "dev")
    h_right, h_total, h_misses = _accuracy(held)
    d_right, d_total, _ = _accuracy(dev)
    by_fold: dict[str, list[str]] = defaultdict(list)
    for name, entry in MANIFEST.items():
        by_fold[fold_of(entry["provenance"])].append(name)
    f_right = {fold: len(names) - len(_accuracy(names)[2]) for fold, names in by_fold.items()}
    f_total = {fold: len(names) for fold, names in by_fold.items()}
    with capsys.disabled():
        _table("held-out logs (never used to write the families or signatures):", h_right, h_total)
        _table("development logs (in-sample):", d_right, d_total)
        _table("all logs by source:", f_right, f_total)
    assert {c: h_right[c] / h_total[c] for c in h_total if h_right[c] / h_total[c] < BAR} == {}, "\n".join(h_misses)
    assert {f: f_right[f] / f_total[f] for f in f_total if f_right[f] / f_total[f] < BAR} == {}


ARTICLE = {
    "Mamba state pool allocation failed": "MAMBA_POOL_ALLOC",
    "Prefix cache miss on mamba state": "PREFIX_CACHE_MISS",
    "Speculative decoding state rollback error": "SPEC_ROLLBACK",
    "Elastic memory pool reallocation timeout": "ELASTIC_TIMEOUT",
    "PD transfer mamba state size mismatch": "PD_STATE_MISMATCH",
}
FORMS = (
    "{m}",
    "WARNING: {m}",
    "[2026-03-02 11:21:07] {m}",
    "[2026-03-02 11:21:07 TP0] WARNING: {m}",
    "[2026-03-02 11:21:07 TP3] ERROR: {m}",
    "[2026-03-02 11:21:07.512 DP1 TP0] {m}",
    "\x1b[33m[2026-03-02 11:21:07 TP0] WARNING: {m}\x1b[0m",
    "(SGLangHttpServer pid=4242) [2026-03-02 11:21:07 TP1] ERROR: {m}",
    "RuntimeError: {m}",
    "2026-03-02 11:21:07,512 - ERROR - {m}.",
    "sglang-1  | [2026-03-02 11:21:07 TP0] {m}",
    "ERROR 03-02 11:21:07 [scheduler.py:2187] {m}",
)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("message", sorted(ARTICLE))
def test_the_articles_five_messages_in_every_form(message: str, form: str) -> None:
    findings = diagnose_lines([form.format(m=message)])
    assert codes_of(findings) == [ARTICLE[message]]
    assert findings[0].line == 1 and message in (findings[0].evidence or "")


def test_the_issues_one_line_repro() -> None:
    (f,) = diagnose_lines(["[2026-03-02 11:21:07 TP0] WARNING: Prefix cache miss on mamba state"])
    assert (f.code, f.line) == ("PREFIX_CACHE_MISS", 1)


def test_interleaved_ranks_are_one_failure_with_their_ranks() -> None:
    findings = diagnose("pool_article_msg1_ranks")
    (f,) = [f for f in findings if f.code == "MAMBA_POOL_ALLOC"]
    assert f.count == 2 and "TP0, TP1" in f.cause


def test_two_failures_in_a_row_are_both_reported_first_cause_first() -> None:
    findings = diagnose("spec_capped_then_crash")
    assert codes_of(findings) == ["MAMBA_POOL_ALLOC", "SPEC_ROLLBACK"]
    assert [f.line for f in findings] == sorted(f.line or 0 for f in findings)


def test_radix_cache_off_by_choice_is_a_note_never_a_failure() -> None:
    for name in ("healthy_radix_off_dict", "healthy_radix_off_cmdline_054"):
        findings = diagnose(name)
        assert [(f.code, f.severity) for f in findings] == [(RADIX_CACHE_OFF, "info")], name


def test_state_pool_oom_is_told_from_kv_pool_oom_by_the_frames() -> None:
    (pool,) = diagnose("pool_wsl2_oom_init_mamba_pool")
    assert pool.code == "MAMBA_POOL_ALLOC" and pool.evidence.startswith("torch.OutOfMemoryError")
    (kv,) = diagnose("crash_kv_pool_oom")
    assert kv.code == UNKNOWN_FAILURE


def test_unknown_failure_names_exception_innermost_sglang_frame_and_nearest_code() -> None:
    (f,) = diagnose("crash_kv_pool_oom")
    assert "torch.OutOfMemoryError" in f.evidence
    assert "sglang.srt.mem_cache.memory_pool._create_buffers" in f.cause
    (g,) = diagnose("crash_nccl")
    assert "DistBackendError" in g.cause and "parallel_state.init_distributed_environment" in g.cause
    lines = [
        "Traceback (most recent call last):",
        '  File "/opt/sglang/python/sglang/srt/speculative/eagle_worker.py", line 700, in draft_forward',
        "IndexError: index 9 is out of bounds for dimension 0 with size 8",
    ]
    (h,) = diagnose_lines(lines)
    assert h.code == UNKNOWN_FAILURE and "Nearest known failure mode: SPEC_ROLLBACK" in h.cause


def test_a_log_ending_in_a_crash_is_never_silent() -> None:
    for tail in (
        ["Traceback (most recent call last):", '  File "x.py", line 1, in f', "ZeroDivisionError: division by zero"],
        ["[2026-01-01 00:00:00] Child process unexpectedly failed with an exit code 1. pid=7"],
        ["[2026-01-01 00:00:00 TP0] Load weight begin.", "ValueError: something no one expected"],
    ):
        assert [f.code for f in diagnose_lines(tail)] == [UNKNOWN_FAILURE], tail


def test_a_deliberate_stop_is_not_a_crash() -> None:
    lines = [
        "[2026-01-01 00:00:00] The server is fired up and ready to roll!",
        "Traceback (most recent call last):",
        '  File "/x/sglang/srt/entrypoints/http_server.py", line 1, in launch_server',
        "KeyboardInterrupt",
    ]
    assert diagnose_lines(lines) == []


def test_a_crash_in_another_logs_format_is_read_too() -> None:
    lines = [
        "(EngineCore_DP0 pid=1) ERROR 11-13 11:03:06 [core.py:708] Traceback (most recent call last):",
        '(EngineCore_DP0 pid=1) ERROR 11-13 11:03:06 [core.py:708]   File "/x/sglang/srt/disaggregation/nixl/conn.py", '
        "line 10, in add_transfer_request",
        "(EngineCore_DP0 pid=1) ERROR 11-13 11:03:06 [core.py:708] KeyError: 'room'",
    ]
    (f,) = diagnose_lines(lines)
    assert f.code == UNKNOWN_FAILURE and "Nearest known failure mode: PD_STATE_MISMATCH" in f.cause


def test_a_request_error_the_server_survives_is_not_a_failure() -> None:
    assert diagnose("healthy_request_error_survived") == []


def test_old_flag_spelling_is_answered_in_the_logs_own_dialect() -> None:
    (old,) = diagnose("spec_no_buffer_qwen35")  # the error itself spells --mamba-scheduler-strategy
    assert "--mamba-scheduler-strategy extra_buffer" in old.fix
    assert "--mamba-radix-cache-strategy" not in old.fix
    by_version = diagnose_lines([
        "[2026-01-05 10:00:00] sglang==0.5.8 starting",
        "AssertionError: mamba extra_buffer is not supported for FalconH1ForCausalLM model",
    ])  # fmt: skip
    assert "SGLang 0.5.8" in by_version[0].fix and "--mamba-scheduler-strategy" in by_version[0].fix
    (new,) = diagnose("prefix_no_buffer_page64")  # a 0.5.23 launch command
    assert "--mamba-radix-cache-strategy extra_buffer" in new.fix


def test_with_a_config_the_fix_is_a_config_edit() -> None:
    cfg = HybridConfig()
    (f,) = diagnose_lines(["ValueError: extra_buffer_lazy unsupported under PD disaggregation"], cfg)
    assert f.code == "PD_STATE_MISMATCH"
    assert [(c.file, c.key, c.value) for c in f.changes] == [
        ("config.toml", "cache.mamba_radix_cache_strategy", "extra_buffer")
    ]


def test_without_a_config_the_pool_fix_comes_from_the_logs_numbers() -> None:
    lines = [
        "[2026-01-10 12:00:00] server_args=ServerArgs(tp_size=4, mamba_scheduler_strategy='extra_buffer', "
        "max_running_requests=64)",
        "[2026-01-10 12:00:41 TP2] AssertionError: Not enough space for mamba cache",
    ]
    (f,) = diagnose_lines(lines)
    assert re.search(r"max_running_requests=64 at \d slots per request \(extra_buffer\)", f.fix), f.fix


def test_traceback_reader_splits_interleaved_ranks_and_joins_continued_messages() -> None:
    scan = scan_log((CORPUS / "pool_052_not_enough_space_tp2.log").read_text(encoding="utf-8").splitlines())
    assert [(tb.short_type, tb.message.startswith("Not enough space for mamba cache")) for tb in scan.tracebacks] == [
        ("AssertionError", True),
        ("AssertionError", True),
    ]
    unified = scan_log((CORPUS / "pool_unified_8ranks.log").read_text(encoding="utf-8").splitlines())
    assert {tb.rank for tb in unified.tracebacks} == {"TP0", "TP1", "TP2"}
    assert all(tb.message.endswith("--mamba-full-memory-ratio or --max-mamba-cache-size") for tb in unified.tracebacks)
    chain = scan_log((CORPUS / "pool_ping_pong_hicache_chain.log").read_text(encoding="utf-8").splitlines())
    (tb,) = chain.tracebacks
    assert [f.func for f in tb.frames][-2:] == ["alloc", "_alloc_ping_pong_buffer"]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def cross_validated() -> tuple[dict[str, int], dict[str, int], list[str]]:
    """Leave one source out. A message pattern that only one source's logs use was fit to that source; with the
    source held out it is dropped, and the source's logs are diagnosed with what is left: the other sources'
    patterns, the message families, the traceback signatures, the model check."""
    users: dict[str, set[str]] = defaultdict(set)  # pattern id -> the sources whose logs it claims
    for path in (CORPUS.parent / "logs").glob("*.log"):
        for m in scan_log(_lines(path)).matches:
            users[m.pattern.id].add("hand-written excerpts")
    for name, entry in MANIFEST.items():
        for m in scan_log(_lines(CORPUS / f"{name}.log")).matches:
            users[m.pattern.id].add(fold_of(entry["provenance"]))
    def held_out(name: str) -> list[str]:
        fold = fold_of(MANIFEST[name]["provenance"])
        kept = tuple(p for p in PATTERNS if users[p.id] - {fold})
        return codes_of(log_findings(scan_log(_lines(CORPUS / f"{name}.log"), kept), RemedyInput(None)))

    return _accuracy(sorted(MANIFEST), held_out, lambda n: f"{n} ({fold_of(MANIFEST[n]['provenance'])})")


def test_cross_validated_accuracy_leaving_each_source_out(capsys: pytest.CaptureFixture[str]) -> None:
    right, total, misses = cross_validated()
    with capsys.disabled():
        _table("leave-one-source-out (patterns fit to the held-out source dropped):", right, total)
        for miss in misses:
            print("   ", miss)
    assert {c: right[c] / total[c] for c in total if right[c] / total[c] < CV_BAR} == {}, "\n".join(misses)
