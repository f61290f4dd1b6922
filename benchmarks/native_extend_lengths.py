"""One sequence's extend by N new tokens through the native step (one C call, the tokens as rows of a chain) vs the
torch extend, in-process on the real engine: the same extend batch, the two paths interleaved call by call.

A fresh `--prefix`-token prompt is prefilled and cached first (the peers harness's cold request); then, per N, the
engine schedules that prefix + N fresh tokens (what a warm request or a multi-turn follow-up is) and the runner's
forward of that batch is timed with the native extend on and off (`NativeDecode.extends`), alternating which goes
first, medians over `--rounds`. The limit the engine applies (`EXTEND_MAX_TOKENS`) is lifted here, so lengths past it
show why it sits where it does. With the prefix cache's default checkpoint interval most lengths cross a checkpoint
position: the batch then carries a state checkpoint, as the engine's does. `--prefix 0`: a fresh prompt of N tokens.

    python benchmarks/native_extend_lengths.py --model DIR [--prefix 2000] [--tokens 48,64,128,256,512]
        [--rounds 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import runtime  # noqa: F401 - first: its OpenMP and malloc settings only take effect before torch loads

# isort: split
import torch

import runtime.engine.native_decode as native_decode
from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore


def drain(core: EngineCore, rid: str, prompt: list[int]) -> None:
    """Run one greedy request to its end (its prompt and state then sit in the prefix cache)."""
    params = SamplingParams(temperature=0, max_new_tokens=2, ignore_eos=True)
    core.scheduler.add_request(GenerateRequest(rid, prompt, params), lambda _: None)
    while core.step():
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory (the peers harness's peer model)")
    ap.add_argument("--prefix", type=int, default=2000, help="cached tokens before the extend (0: a fresh prompt)")
    ap.add_argument("--tokens", default="48,64,128,256,512", help="comma list of new-token counts")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    flush_denormals_on_this_thread()  # as the server's engine thread does
    torch.set_num_threads(args.threads)
    core = EngineCore(EngineArgs(model_path=args.model, context_length=16384, max_running_requests=8))
    native = core.runner.native_decode
    if native is None:
        raise SystemExit(f"error: no native step for this model or host: {core.runner.native_status.line()}")
    native_decode.EXTEND_MAX_TOKENS = 1 << 20  # every length the native way too (the engine's limit is the question)
    rng = random.Random(0)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(3, 4000) for _ in range(n)]

    drain(core, "warm-up", fresh(args.prefix + 16))
    prefix = fresh(args.prefix)
    if prefix:
        drain(core, "prefix", prefix + fresh(8))
    sched, runner = core.scheduler, core.runner
    print(f"model={args.model} prefix={args.prefix} threads={args.threads} rounds={args.rounds} (forward medians)")
    for n in [int(t) for t in args.tokens.split(",")]:
        params = SamplingParams(temperature=0, max_new_tokens=1)
        sched.add_request(GenerateRequest(f"x{n}", prefix + fresh(n), params), lambda _: None)
        batch = sched.schedule()
        assert batch is not None and batch.mode == "extend"
        fb = runner.prepare(batch)
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.rounds + 1):
            for on in (True, False) if r % 2 == 0 else (False, True):
                native.extends = on
                t0 = time.perf_counter()
                runner.forward(fb)
                if r:  # the first round warms both paths up
                    times[on].append(time.perf_counter() - t0)
        native.extends = True
        sched.abandon(batch)  # its checkpoint slots back; the abort frees the rest
        sched.abort(f"x{n}")
        nat, tor = (1000 * statistics.median(times[k]) for k in (True, False))
        marks = sum(len(c) for c in fb.state_checkpoints or [])
        print(
            f"new tokens {n:5d} (cached {fb.prefix_lens[0]}, state checkpoints {marks}): native {nat:7.2f} ms, "
            f"torch {tor:7.2f} ms, torch / native {tor / nat:.2f}"
        )


if __name__ == "__main__":
    main()
