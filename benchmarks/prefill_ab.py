"""Cold prefill and warm extend of two runtime trees, side by side in one run, on the real-size peer models.

Per model and tree, one worker process loads the engine once (in-process `EngineCore.step()`, the runtime's
defaults: `--dtype auto`, radix cache with in-forward checkpoints); then rounds alternate between the trees
(A then B, B then A, ...) so a shared host's load hits both. A round is the peers harness's pair: a cold prompt
of --tokens fresh tokens, then a warm one sharing its first --shared tokens (the radix cache serves them; the
rest is the extend). Reported per tree: median wall TTFT and process CPU time (both threads; it moves less with
the host's load than wall time), and B / A per metric.

    python benchmarks/prefill_ab.py --a TREE_A [--b TREE_B] [--models DIR ...] [--rounds 3] [--threads 2]
        [--tokens 2048] [--shared 2000]
    python benchmarks/prefill_ab.py --base-rev REV      # A: REV's runtime/ + hybridshared/, B: this tree

A tree is a directory holding `runtime/` and `hybridshared/` (`git archive REV runtime hybridshared | tar -x -C
DIR`; --base-rev does that in a temp dir). Default models: the peers harness's real-size checkpoints
(benchmarks/peers/.work/real-qwen3-next, real-nemotron-h; `python benchmarks/peers/peer_model.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS = [HERE / "peers" / ".work" / "real-qwen3-next", HERE / "peers" / ".work" / "real-nemotron-h"]


def worker(model: str, threads: int, tokens: int, shared: int) -> None:
    """Load once, then per line on stdin run one cold + warm pair and print its timings as one JSON line."""
    import random
    import time

    import runtime  # noqa: F401 - first: its OpenMP and malloc settings only take effect before torch loads

    # isort: split
    import torch

    from runtime.core.config import EngineArgs
    from runtime.core.requests import GenerateRequest, SamplingParams
    from runtime.engine.denormals import flush_denormals_on_this_thread
    from runtime.engine.engine_core import EngineCore

    flush_denormals_on_this_thread()  # as the server's engine thread does
    torch.set_num_threads(threads)
    core = EngineCore(EngineArgs(model_path=model, context_length=16384, max_running_requests=8))
    vocab = int(getattr(core.model.config, "vocab_size", 4096))
    rng = random.Random(0)

    def request(rid: str, prompt: list[int]) -> dict[str, float]:
        first: list[float] = []
        cached: list[int] = []

        def on_output(o: object) -> None:
            if not first and getattr(o, "new_token_ids", None):
                first.append(time.perf_counter())
            if getattr(o, "finished", False):
                cached.append(int(getattr(o, "cached_tokens", 0)))

        params = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)
        cpu, wall = time.process_time(), time.perf_counter()
        core.scheduler.add_request(GenerateRequest(rid, prompt, params), on_output)
        while core.scheduler.has_work:
            core.step()
        return {"ttft_ms": (first[0] - wall) * 1e3, "cpu_ms": (time.process_time() - cpu) * 1e3, "cached": cached[0]}

    def pair(tag: str) -> dict[str, dict[str, float]]:
        cold = [rng.randrange(3, vocab) for _ in range(tokens)]
        warm = cold[:shared] + [rng.randrange(3, vocab) for _ in range(tokens - shared)]
        return {"cold": request(f"c{tag}", cold), "warm": request(f"w{tag}", warm)}

    pair("warmup")
    print("ready", flush=True)
    for i, _ in enumerate(sys.stdin):
        print(json.dumps(pair(str(i))), flush=True)


def start(tree: Path, model: Path, a: argparse.Namespace) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--worker", "--models", str(model), "--threads", str(a.threads)]
    cmd += ["--tokens", str(a.tokens), "--shared", str(a.shared)]
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise SystemExit(f"worker for {tree} on {model} did not start (said {line!r})")
    return proc


def one_round(proc: subprocess.Popen[str]) -> dict[str, dict[str, float]]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    result: dict[str, dict[str, float]] = json.loads(proc.stdout.readline())
    return result


def compare(model: Path, trees: dict[str, Path], a: argparse.Namespace) -> None:
    procs = {label: start(tree, model, a) for label, tree in trees.items()}
    runs: dict[str, list[dict[str, dict[str, float]]]] = {label: [] for label in trees}
    try:
        for r in range(a.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for label in order:
                runs[label].append(one_round(procs[label]))
    finally:
        for proc in procs.values():
            proc.kill()
    print(f"\n{model.name}: {a.tokens}-token cold prompt, warm shares {a.shared}; {a.rounds} rounds, medians")
    medians: dict[str, dict[str, float]] = {}
    for label in trees:
        m = {
            f"{kind} {metric}": statistics.median(run[kind][metric] for run in runs[label])
            for kind in ("cold", "warm")
            for metric in ("ttft_ms", "cpu_ms")
        }
        m["warm/cold TTFT"] = m["warm ttft_ms"] / m["cold ttft_ms"]
        medians[label] = m
        cached = runs[label][-1]["warm"]["cached"]
        print(f"  {label} ({trees[label]}): warm request cached {cached:.0f} tokens")
    labels = list(trees)
    header = " ".join(f"{label:>10s}" for label in labels)
    print(f"  {'metric':16s} {header}" + ("   B / A" if len(labels) == 2 else ""))
    for metric in medians[labels[0]]:
        values = [medians[label][metric] for label in labels]
        ratio = f"   {values[1] / values[0]:.3f}" if len(values) == 2 and values[0] else ""
        print(f"  {metric:16s} " + " ".join(f"{v:10.3f}" if v < 1 else f"{v:10.1f}" for v in values) + ratio)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, help="tree A (holds runtime/ and hybridshared/)")
    ap.add_argument("--b", type=Path, default=HERE.parent, help="tree B (default: this checkout)")
    ap.add_argument("--base-rev", help="A = this git revision of the checkout, extracted to a temp dir")
    ap.add_argument("--models", type=Path, nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--shared", type=int, default=2000)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(str(a.models[0]), a.threads, a.tokens, a.shared)
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree_a = a.a
        if a.base_rev:
            tree_a = Path(tmp)
            archive = subprocess.run(
                ["git", "archive", a.base_rev, "runtime", "hybridshared"], cwd=HERE.parent, capture_output=True
            )
            if archive.returncode:
                raise SystemExit(archive.stderr.decode())
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        if tree_a is None:
            raise SystemExit("give --a TREE or --base-rev REV")
        trees = {"A": tree_a.resolve(), "B": a.b.resolve()}
        for model in a.models:
            compare(model.resolve(), trees, a)  # the workers run in the trees' directories


if __name__ == "__main__":
    main()
