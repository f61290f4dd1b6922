"""SGLang 0.5.23's own `bench_serving --cache-report` against the bundled runtime, on its three SGLang backends.

The runtime serves the demo model (or --model-path) on loopback; bench_serving runs the same shared-prefix
workload (generated-shared-prefix: groups of prompts sharing a system prompt) through `sglang` (native
/generate, reads meta_info.cached_tokens), `sglang-oai` (/v1/completions) and `sglang-oai-chat`
(/v1/chat/completions; both read `sglext.cached_tokens_details`, which bench_serving asks for with
`return_cached_tokens_details`). The cache is flushed before each backend, and requests go one at a time, so the
three runs see the same cache states. Prints the hit rates side by side.

Running bench_serving on a CPU-only host. `python -m sglang.bench_serving` needs no GPU, but importing it pulls
in more of SGLang than the client uses: `sglang.srt.disaggregation.utils` (for one constant,
FAKE_BOOTSTRAP_HOST) imports the model configs, which import torchvision. This script therefore runs
bench_serving through a small launcher that puts SGLang's value of that constant (read from its source) in place
of that module, and appends SGLang's site-packages (--sglang-venv: the venv of `pip install sglang==0.5.23`,
read only) at the END of the interpreter's path, so bench_serving's client dependencies (aiohttp, msgspec,
pybase64, psutil, ...) come from there unless the interpreter has them. Two are missing from that venv on a
CPU-only install and must be in the interpreter (--bench-python, default this one): transformers (bench_serving
loads the tokenizer with AutoTokenizer) and datasets (imported by its dataset registry). For example:

    python -m venv --system-site-packages /tmp/bench-venv && /tmp/bench-venv/bin/pip install datasets psutil
    PYTHONPATH=. python benchmarks/bench_serving_cache_report.py --sglang-venv .venv-sglang \\
        --bench-python /tmp/bench-venv/bin/python

On a host where `pip install sglang==0.5.23` brought its full dependency set (a GPU host), plain
`python -m sglang.bench_serving --backend sglang-oai --cache-report ...` does the same.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")

# Replaces `sglang.srt.disaggregation.utils` by SGLang's value of the one name bench_serving imports from it,
# then runs `python -m sglang.bench_serving` with the remaining arguments (argv[1]: SGLang's site-packages).
LAUNCHER = """
import ast, pathlib, runpy, sys, types
site = sys.argv[1]
sys.path.append(site)
name = "sglang.srt.disaggregation.utils"
mod = types.ModuleType(name)
for node in ast.parse(pathlib.Path(site, *name.split(".")).with_suffix(".py").read_text()).body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "FAKE_BOOTSTRAP_HOST" for t in node.targets):
        exec(compile(ast.Module([node], []), name, "exec"), mod.__dict__)
sys.modules[name] = mod
sys.argv = ["bench_serving", *sys.argv[2:]]
runpy.run_module("sglang.bench_serving", run_name="__main__")
"""


def sglang_site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages/sglang"))
    if not found:
        sys.exit(f"{venv}: no lib/python3*/site-packages/sglang; pass --sglang-venv (a venv with sglang==0.5.23)")
    return found[0].parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(model), "--host", "127.0.0.1", "--port", str(port),
           "--memory-budget-gib", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the runtime exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"the runtime was not healthy after 300 s; see {log}")


def run_backend(args: argparse.Namespace, site: Path, url: str, model: Path, backend: str, out: Path) -> dict:
    httpx.post(f"{url}/flush_cache", timeout=60).raise_for_status()
    cmd = [
        args.bench_python, "-c", LAUNCHER, str(site),
        "--backend", backend, "--base-url", url, "--model", str(model), "--tokenizer", str(model),
        "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", str(args.groups),
        "--gsp-prompts-per-group", str(args.prompts_per_group), "--gsp-system-prompt-len", str(args.system_len),
        "--gsp-question-len", str(args.question_len), "--gsp-output-len", str(args.output_len),
        "--num-prompts", str(args.groups * args.prompts_per_group), "--max-concurrency", "1",
        "--seed", "1", "--cache-report", "--output-file", str(out), "--disable-tqdm",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.is_file():
        sys.exit(f"bench_serving --backend {backend} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                 f"{done.stderr[-3000:]}")  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return lines[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", type=Path, help="default: the demo model, built in a temporary directory")
    ap.add_argument("--sglang-venv", type=Path, default=Path(os.environ.get("HYBRIDCTL_SGLANG_VENV", ".venv-sglang")))
    ap.add_argument("--bench-python", default=sys.executable, help="interpreter with bench_serving's client deps")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--prompts-per-group", type=int, default=4)
    ap.add_argument("--system-len", type=int, default=256)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=8)
    args = ap.parse_args()
    site = sglang_site_packages(args.sglang_venv)
    work = Path(tempfile.mkdtemp(prefix="bench-cache-report-"))
    model = args.model_path
    if model is None:
        from runtime.demo_model import build_demo_model

        model = Path(build_demo_model(work / "model"))
    port = free_port()
    proc = start_server(model, port, work / "server.log")
    rows = []
    try:
        for backend in BACKENDS:
            result = run_backend(args, site, f"http://127.0.0.1:{port}", model, backend, work / f"{backend}.jsonl")
            report = result.get("cache_report") or {}
            rows.append((backend, result.get("completed"), report.get("total_prompt_tokens"),
                         report.get("total_cached_tokens"), report.get("cache_hit_rate_pct")))  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    print(f"{'backend':<18}{'completed':>10}{'prompt tok':>12}{'cached tok':>12}{'hit rate %':>12}")
    for backend, completed, prompt, cached, rate in rows:
        print(f"{backend:<18}{completed!s:>10}{prompt!s:>12}{cached!s:>12}{rate!s:>12}")
    print(f"(logs and bench_serving JSON in {work})")


if __name__ == "__main__":
    main()
