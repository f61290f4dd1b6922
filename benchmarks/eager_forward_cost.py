"""The eager forward's per-step cost (the default configuration: no torch.compile): aten calls and CPU time per
decode step at several batch sizes, and per short extend, through the real engine in-process.

Per batch size B: B requests with `--prompt`-token random prompts are prefilled, then `--steps` decode steps are
timed. Reported per step: the model forward's CPU time (time.thread_time around `ModelRunner.forward`; one
intra-op thread by default, so it is the whole forward's CPU), its ops as the Python code dispatches them
("ops": a TorchDispatchMode count; a composite such as linear counts once) and its aten calls (torch.profiler:
every aten op, nested ones too). "extend": a fresh `--extend`-token prompt's prefill forward.

A/B in one run: `--against DIR` (a checkout of another commit, e.g. from `git archive`) runs this script's worker
on that tree and on this one, alternating `--rounds` times, so both see the same host load; medians per tree and
the ratio other / this.

    python benchmarks/eager_forward_cost.py --model DIR [--batches 1,8] [--steps 40] [--against OLD_TREE]
    python benchmarks/eager_forward_cost.py --family kimi_linear ...  # a reference test's tiny model instead

`--family` saves the tiny, randomly initialised transformers model that tests/runtime/test_model_reference.py
checks that family against (qwen3_next, qwen3_5_moe, kimi_linear, nemotron_h, falcon_h1, granitemoehybrid) to a
temporary directory: op counts per architecture (its timings mean little: the models are tiny).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _worker(a: argparse.Namespace) -> dict[str, float]:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode

    from runtime.core.batch import ForwardBatch
    from runtime.core.config import EngineArgs
    from runtime.core.requests import GenerateRequest, SamplingParams
    from runtime.engine.denormals import flush_denormals_on_this_thread
    from runtime.engine.engine_core import EngineCore

    flush_denormals_on_this_thread()
    torch.set_num_threads(a.threads)
    core = EngineCore(EngineArgs(model_path=str(a.model), context_length=4096, max_running_requests=8))
    sched, runner = core.scheduler, core.runner
    cpu: list[float] = []
    inner = runner.forward

    def timed_forward(batch: ForwardBatch) -> torch.Tensor:
        t = time.thread_time()
        out = inner(batch)
        cpu.append(time.thread_time() - t)
        return out

    runner.forward = timed_forward  # type: ignore[method-assign]
    rng = random.Random(0)
    vocab = core.model.layout().vocab_size

    def prompt(n: int) -> list[int]:
        return [rng.randrange(10, vocab - 10) for _ in range(n)]

    class _Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            _Count.calls += 1
            return func(*args, **(kwargs or {}))

    def top_ops(steps: int) -> float:
        """Ops as the Python code dispatches them (a composite like linear counts once)."""
        _Count.calls = 0
        with _Count():
            for _ in range(steps):
                core.step()
        return _Count.calls / steps

    def aten_calls(steps: int) -> float:
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(steps):
                core.step()
        return sum(e.count for e in p.key_averages() if e.key.startswith("aten::")) / steps

    out: dict[str, float] = {}
    params = SamplingParams(temperature=0, max_new_tokens=a.steps + 40, ignore_eos=True)
    for bs in (int(b) for b in a.batches.split(",")):
        for i in range(bs):
            sched.add_request(GenerateRequest(f"b{bs}-{i}", prompt(a.prompt), params), lambda _o: None)
        while len(sched.running) < bs or any(len(r.output_ids) < 2 for r in sched.running):
            core.step()
        for _ in range(5):
            core.step()
        cpu.clear()
        for _ in range(a.steps):
            core.step()
        out[f"decode b{bs} cpu ms"] = 1e3 * statistics.median(cpu)
        out[f"decode b{bs} ops"] = top_ops(3)
        out[f"decode b{bs} aten calls"] = aten_calls(3)
        while sched.has_work:
            core.step()
    one = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)
    ext: list[float] = []
    for i in range(a.extend_repeats):
        sched.add_request(GenerateRequest(f"e{i}", prompt(a.extend), one), lambda _o: None)
        cpu.clear()
        core.step()
        ext.append(cpu[0])
        while sched.has_work:
            core.step()
    out[f"extend {a.extend} cpu ms"] = 1e3 * statistics.median(ext)
    sched.add_request(GenerateRequest("e-prof", prompt(a.extend), one), lambda _o: None)
    out[f"extend {a.extend} aten calls"] = aten_calls(1)
    while sched.has_work:
        core.step()
    sched.add_request(GenerateRequest("e-ops", prompt(a.extend), one), lambda _o: None)
    out[f"extend {a.extend} ops"] = top_ops(1)
    while sched.has_work:
        core.step()
    return out


def _run_worker(tree: Path, argv: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "RUNTIME_SMALL_FORWARD_THREADS": os.environ.get(
        "RUNTIME_SMALL_FORWARD_THREADS", "1")}  # fmt: skip
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", *argv]
    res = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"worker on {tree} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--family", help="a reference test's tiny model instead of --model (needs transformers)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens of each decoding request")
    ap.add_argument("--extend", type=int, default=48, help="tokens of the timed short extend")
    ap.add_argument("--extend-repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", type=Path, help="another tree to compare with, interleaved")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a, _ = ap.parse_known_args()
    if a.worker:
        print(json.dumps(_worker(a)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if a.family is not None:
            a.model = _save_family(a.family, Path(tmp))
        elif a.model is None:
            ap.error("give --model DIR or --family NAME")
        _compare(a)


def _save_family(name: str, out: Path) -> Path:
    import torch

    sys.path.insert(0, str(HERE.parent))
    from tests.runtime import test_model_reference as ref

    if name not in ref.ARCHS:
        raise SystemExit(f"--family {name}: not one of {', '.join(sorted(ref.ARCHS))}")
    torch.manual_seed(0)
    hf: Any = ref.ARCHS[name][0]().eval()
    ref._perturb(hf, 1)  # as the test does: every weight matters
    getattr(hf, "save_pretrained")(out / name)  # noqa: B009 - a transformers model; its stubs type it as a Tensor
    return out / name


def _compare(a: argparse.Namespace) -> None:
    argv = [f"--model={a.model.resolve()}", f"--batches={a.batches}", f"--steps={a.steps}", f"--prompt={a.prompt}"]
    argv += [f"--extend={a.extend}", f"--extend-repeats={a.extend_repeats}", f"--threads={a.threads}"]
    trees = {"this": HERE.parent} | ({"other": a.against.resolve()} if a.against else {})
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(a.rounds):
        order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
        for name, tree in order:
            samples[name].append(_run_worker(tree, argv))
    print(f"model {a.model}, {a.threads} thread(s), load average {os.getloadavg()[0]:.2f}, {a.rounds} rounds (medians)")
    keys = list(samples["this"][0])
    header = "| metric | this (min-max) | " + ("other (min-max) | other / this |" if a.against else "")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for k in keys:
        this = statistics.median(s[k] for s in samples["this"])
        row = f"| {k} | {this:.3f} {_spread(samples['this'], k)} |"
        if a.against:
            other = statistics.median(s[k] for s in samples["other"])
            row += f" {other:.3f} {_spread(samples['other'], k)} | {other / this:.2f}x |"
        print(row)


def _spread(samples: list[dict[str, float]], key: str) -> str:
    values = [s[key] for s in samples]
    return f"({min(values):.3f}-{max(values):.3f})" if len(values) > 1 else ""


if __name__ == "__main__":
    main()
