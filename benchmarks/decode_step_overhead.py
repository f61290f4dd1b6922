"""A decode step's time outside the model forward, at several context lengths: the KV index built per step from
the page lists (before) vs kept up to date incrementally by each request's PageList (now).

One process, one engine (eager, --threads intra-op threads), one running request per context length; blocks of
--block steps alternate between the two implementations of `CacheManager.grow_for_decode` (the old one is
copied here), so both see the same host load. Per step: wall time of `EngineCore.step()` minus the wall time of
its model forward. Prints medians per block and the ratio old / new.

    python benchmarks/decode_step_overhead.py [--model DIR] [--contexts 256,2048,8000] [--blocks 6] [--block 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(1, str(HERE.parent))

from runtime.core.config import EngineArgs  # noqa: E402
from runtime.core.requests import GenerateRequest, SamplingParams  # noqa: E402
from runtime.engine.engine_core import EngineCore  # noqa: E402
from runtime.kvcache.cache_manager import CacheManager, ReqMemory  # noqa: E402


def old_grow_for_decode(self: CacheManager, mems: list[ReqMemory]) -> tuple[list[int], list[torch.Tensor]]:
    """grow_for_decode as it was (5a1efd8), page size 1: the rows rebuilt from the page lists every step."""
    news = [self.grow(mem, 1) for mem in mems]
    out_locs = [slot for new in news for slot in new]
    rows = [mem.pages[: mem.kv_len] + new for mem, new in zip(mems, news, strict=True)]
    flat = torch.tensor([slot for row in rows for slot in row], dtype=torch.int64)
    return out_locs, list(torch.split(flat, [len(row) for row in rows]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="model directory (default: the peers harness's peer model)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--contexts", default="256,2048,8000")
    ap.add_argument("--blocks", type=int, default=6, help="blocks per implementation")
    ap.add_argument("--block", type=int, default=20, help="steps per block")
    a = ap.parse_args()
    from peer_model import peer_model_dir

    model = peer_model_dir(a.model)
    torch.set_num_threads(a.threads)
    core = EngineCore(EngineArgs(model_path=str(model), context_length=16384, max_running_requests=8))
    sched = core.scheduler
    forward_s = [0.0]
    run_model = sched.run_model

    def timed_forward(batch: object) -> torch.Tensor:
        t = time.perf_counter()
        out = run_model(batch)
        forward_s[0] += time.perf_counter() - t
        return out

    sched.run_model = timed_forward
    new_grow = CacheManager.grow_for_decode
    rng = random.Random(0)
    steps = 2 * a.blocks * a.block + 4
    print(f"model {model}, {a.threads} thread(s); ms per decode step outside the forward (medians of blocks)")
    for ctx in (int(c) for c in a.contexts.split(",")):
        params = SamplingParams(temperature=0, max_new_tokens=steps, ignore_eos=True)
        sched.add_request(GenerateRequest(f"ctx{ctx}", [rng.randrange(10, 4000) for _ in range(ctx)], params),
                          lambda _o: None)  # fmt: skip
        while not sched.running or sched.running[0].mem is None or len(sched.running[0].output_ids) < 2:
            core.step()
        per: dict[str, list[float]] = {"before": [], "now": []}
        fwd: list[float] = []
        for block in range(2 * a.blocks):
            name = "before" if block % 2 == 0 else "now"
            CacheManager.grow_for_decode = old_grow_for_decode if name == "before" else new_grow  # type: ignore[method-assign]
            samples = []
            for _ in range(a.block):
                forward_s[0] = 0.0
                t = time.perf_counter()
                core.step()
                samples.append(time.perf_counter() - t - forward_s[0])
                fwd.append(forward_s[0])
            per[name].append(statistics.median(samples) * 1e3)
        CacheManager.grow_for_decode = new_grow  # type: ignore[method-assign]
        while sched.has_work:
            core.step()
        b, n = statistics.median(per["before"]), statistics.median(per["now"])
        blocks = "; ".join(f"{k} " + " ".join(f"{x:.2f}" for x in v) for k, v in per.items())
        print(f"context {ctx:6d}: before {b:.3f} ms, now {n:.3f} ms, before / now {b / n:.2f}x; forward "
              f"{statistics.median(fwd) * 1e3:.2f} ms (blocks: {blocks})")  # fmt: skip


if __name__ == "__main__":
    main()
