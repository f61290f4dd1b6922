"""Which step holds a decoding stream's longest gap while an 8000-token prompt is prefilled, in-process (no
server): one stream decodes, the prompt arrives, and every step until its first token is timed with its prompt
tokens and its position in the prompt. Configurations side by side on one engine each, rounds alternating:
`auto` (the pause target's budget, runtime/scheduler/step_budget.py) and fixed caps (`--decoding-step-tokens N`).

Per round and configuration: the longest gap between the stream's tokens, the step that held it (position,
tokens, wall ms), the long prompt's TTFT and the process CPU time it took, and the steps by quarter of the prompt
(median wall ms and tokens): where a step's cost grows with its position (attention over the prefix) and whether
the budget follows it. `--trace` prints every step.

    python benchmarks/mixed_gap_trace.py [--model DIR] [--configs auto,256] [--long 8000] [--rounds 2]
        [--threads 2] [--trace]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(1, str(HERE.parent))

import runtime  # noqa: E402, F401 - first: its OpenMP and malloc settings only take effect before torch loads

# isort: split
import torch  # noqa: E402
from peer_model import peer_model_dir  # noqa: E402

from runtime.core.config import EngineArgs  # noqa: E402
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams  # noqa: E402
from runtime.engine.engine_core import EngineCore  # noqa: E402

Step = tuple[int, int, float]  # position in the long prompt, its prompt tokens this step, wall seconds


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def one_round(core: EngineCore, long: int, vocab: int, seed: int) -> tuple[float, Step, float, float, list[Step]]:
    """(longest gap, the step that ended it, TTFT, CPU seconds, every step) for one arrival of the long prompt."""
    rng = random.Random(seed)
    sched = core.scheduler
    arrivals: list[float] = []

    def on_stream(out: RequestOutput) -> None:
        if out.new_token_ids:
            arrivals.append(time.perf_counter())

    sched.add_request(
        GenerateRequest("stream", [rng.randrange(1, vocab) for _ in range(128)], _greedy(1 << 20)), on_stream
    )
    for _ in range(20):  # the stream decodes, warm
        core.step()
    sched.add_request(
        GenerateRequest("long", [rng.randrange(1, vocab) for _ in range(long)], _greedy(1)), lambda _: None
    )
    steps: list[Step] = []
    ends: list[float] = []
    sent, cpu0 = time.perf_counter(), sum(os.times()[:2])
    while any(r.rid == "long" for r in sched.running + sched.waiting):
        position = _position(core, 0)
        start = time.perf_counter()
        core.step()
        ends.append(time.perf_counter())
        steps.append((position, _position(core, long) - position, ends[-1] - start))  # finished: its memory is gone
    done, cpu = time.perf_counter(), sum(os.times()[:2]) - cpu0
    for _ in range(3):
        core.step()
    sched.abort("stream")
    gaps = [(b - a, b) for a, b in zip(arrivals, arrivals[1:], strict=False) if b > sent and a < done]
    gap, end = max(gaps)
    holder = min(range(len(ends)), key=lambda i: abs(ends[i] - end))  # the stream's token comes at a step's end
    return gap, steps[holder], done - sent, cpu, steps


def _position(core: EngineCore, default: int) -> int:
    """The long prompt's tokens in KV so far (`default` when it holds none: not admitted yet, or finished)."""
    return next((r.mem.kv_len for r in core.scheduler.running if r.rid == "long" and r.mem is not None), default)


def _quarters(steps: list[Step], long: int) -> str:
    parts = []
    for q in range(4):
        band = [s for s in steps if q * long // 4 <= s[0] < (q + 1) * long // 4]
        if band:
            ms = statistics.median(1000 * s[2] for s in band)
            tokens = statistics.median(s[1] for s in band)
            parts.append(f"Q{q + 1} {ms:.0f} ms/{tokens:.0f} tok")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the peers harness's model)")
    p.add_argument("--configs", default="auto,256", help="comma list of auto and token counts")
    p.add_argument("--long", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--trace", action="store_true", help="print every step (position:tokens:ms)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = peer_model_dir(args.model)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    cores = {
        name: EngineCore(
            EngineArgs(
                model_path=str(model),
                context_length=max(16384, args.long + 1024),
                max_running_requests=8,
                decoding_step_tokens=name if name == "auto" else int(name),
            )
        )
        for name in names
    }
    vocab = cores[names[0]].model.layout().vocab_size
    print(f"{model}: a {args.long}-token prompt among 1 stream, {args.threads} threads; load {os.getloadavg()}")
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            gap, (pos, tokens, secs), ttft, cpu, steps = one_round(cores[name], args.long, vocab, r)
            print(
                f"round {r} {name:>5}: longest gap {gap * 1000:.0f} ms, at step {pos}+{tokens} ({secs * 1000:.0f} ms);"
                f" TTFT {ttft * 1000:.0f} ms, CPU {cpu:.2f} s, {len(steps)} steps; {_quarters(steps, args.long)}",
                flush=True,
            )
            if args.trace:
                print("   " + " ".join(f"{p_}:{t}:{1000 * s:.0f}" for p_, t, s in steps))
    print(f"load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
