"""Resident memory of `python -m runtime`: idle after start-up, then after a load, from /proc (not a timing).

Starts the server with the given flags (default: the default configuration, as `hybridctl launch` starts it),
reads VmRSS / VmHWM of its process group (benchmarks/peers/engines.py `resident_mib`) once /health answers,
then sends one 2048-token prompt, eight concurrent 128-in / 128-out requests and three more 2048-token prompts
(greedy, ignore EOS, distinct random ids) and reads them again: the peak (VmHWM) and what stays resident.

    python benchmarks/resident_memory.py [--model DIR] [--threads 2] [--runtime-arg=--context-length ...]

The model defaults to the peers harness's (benchmarks/peers/.work/peer-model, built if missing).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(1, str(HERE.parent))

import engines  # noqa: E402
from clients import RuntimeClient  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="model directory (default: the peers harness's peer model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runtime-arg", action="append", default=[], metavar="ARG", help="one more server flag")
    a = ap.parse_args()
    from peer_model import peer_model_dir

    model = peer_model_dir(a.model)
    port = engines.free_port()
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(model), "--host", "127.0.0.1", "--port", str(port),
           "--num-threads", str(a.threads), *a.runtime_arg]  # fmt: skip
    launch = engines.Launch(cmd, RuntimeClient(f"http://127.0.0.1:{port}"), "", startup_timeout_s=1800.0)
    log = Path(engines.WORK / "logs" / "resident_memory.log")
    running = engines.start(launch, log, a.threads)
    rng = random.Random(0)

    def generate(n_in: int, n_out: int) -> None:
        ids = [rng.randrange(10, 4000) for _ in range(n_in)]
        sampling = {"max_new_tokens": n_out, "temperature": 0, "ignore_eos": True}
        res = httpx.post(f"{launch.client.url}/generate", json={"input_ids": ids, "sampling_params": sampling},  # type: ignore[attr-defined]
                         timeout=1800)  # fmt: skip
        res.raise_for_status()

    try:
        time.sleep(2.0)
        idle, idle_hwm = engines.resident_mib(running)
        generate(2048, 16)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: generate(128, 128), range(8)))
        for _ in range(3):
            generate(2048, 32)
        after, peak = engines.resident_mib(running)
    finally:
        engines.stop(running)
    print(f"flags: {' '.join(a.runtime_arg) or '(defaults)'} --num-threads {a.threads}; log {log}")
    print(
        f"idle: VmRSS {idle:.0f} MiB (VmHWM {idle_hwm:.0f}); "
        f"after the load: VmRSS {after:.0f} MiB, peak VmHWM {peak:.0f} MiB"
    )


if __name__ == "__main__":
    main()
