"""What a mixed step costs next to the two steps it replaces, in-process (no server): `--decoding` requests decode
while a `--long`-token prompt is prefilled under the same per-step cap, once with mixing on (each step: a prompt
chunk + one decode row per decoding request) and once with it off (a prefill step, then a decode step), in
alternating rounds.

Per configuration and round it prints the median step time of the mixed steps, or of the prefill steps and of the
decode steps, the longest step, and the wall time until the long prompt's first token. `--native-decode off` runs
the Qwen3-Next family through torch: a mixed step is then one forward with both kinds of row; with the native step
(auto) a chunk of one sequence and the decode rows are two C calls.

    python benchmarks/mixed_step_cost.py [--model DIR] [--decoding 1] [--long 8000] [--step-tokens 256]
        [--native-decode auto] [--threads 2] [--rounds 2]
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

import torch  # noqa: E402
from peer_model import peer_model_dir  # noqa: E402

from runtime.core.config import EngineArgs  # noqa: E402
from runtime.core.requests import GenerateRequest, SamplingParams  # noqa: E402
from runtime.engine.engine_core import EngineCore  # noqa: E402


def one_round(core: EngineCore, decoding: int, long: int, vocab: int, seed: int) -> str:
    rng = random.Random(seed)

    def greedy(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)

    sched = core.scheduler
    for i in range(decoding):
        prompt = [rng.randrange(1, vocab) for _ in range(128)]
        sched.add_request(GenerateRequest(f"d{i}", prompt, greedy(1 << 20)), lambda _: None)
    while any(r.in_prefill for r in sched.running) or sched.waiting:
        core.step()
    for _ in range(8):  # decoding, warm
        core.step()
    prompt = [rng.randrange(1, vocab) for _ in range(long)]
    sched.add_request(GenerateRequest("long", prompt, greedy(1)), lambda _: None)
    steps: list[tuple[str, float]] = []
    start = time.perf_counter()
    while any(r.rid == "long" for r in sched.running + sched.waiting):
        batch = sched.schedule()
        assert batch is not None
        t = time.perf_counter()
        sched.postprocess(batch, core.runner.run(batch))
        kind = "mixed" if batch.decode_rows else "prefill" if batch.mode == "extend" else "decode"
        steps.append((kind, time.perf_counter() - t))
    wall = time.perf_counter() - start
    for r in list(sched.running):
        sched.abort(r.rid)
    parts = []
    for kind in ("mixed", "prefill", "decode"):
        ms = [1000 * s for k, s in steps if k == kind]
        if ms:
            parts.append(f"{len(ms)} {kind} steps median {statistics.median(ms):.1f} ms")
    longest = 1000 * max(s for _, s in steps)
    return f"{'; '.join(parts)}; longest step {longest:.0f} ms; long prompt's first token after {wall * 1000:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--decoding", type=int, default=1)
    p.add_argument("--long", type=int, default=8000)
    p.add_argument("--step-tokens", type=int, default=256)
    p.add_argument("--native-decode", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = peer_model_dir(args.model)
    cores = {
        mixed: EngineArgs(
            model_path=str(model),
            context_length=max(16384, args.long + 1024),
            max_running_requests=max(8, args.decoding + 1),
            enable_mixed_chunk=mixed,
            decoding_step_tokens=args.step_tokens,
            native_decode=args.native_decode,
        )
        for mixed in (True, False)
    }
    engines = {mixed: EngineCore(ea) for mixed, ea in cores.items()}
    vocab = engines[True].model.layout().vocab_size
    native = engines[True].runner.native_status
    setup = f"{args.decoding} decoding, a {args.long}-token prompt, cap {args.step_tokens}, native {native}"
    print(f"{model}: {setup}, {args.threads} threads; load {os.getloadavg()}", flush=True)
    for r in range(args.rounds):
        for mixed in (True, False) if r % 2 == 0 else (False, True):
            label = "mixed      " if mixed else "alternating"
            print(f"round {r} {label}: {one_round(engines[mixed], args.decoding, args.long, vocab, r)}", flush=True)
    print(f"load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
