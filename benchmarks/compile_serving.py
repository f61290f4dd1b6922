"""Start-up of `python -m runtime --enable-torch-compile` as a client sees it: seconds to /health, and with
`--torch-compile-in-background` what the server serves while it compiles (single-stream greedy decode tok/s, eager)
and after the compiled forwards are swapped in, from /server_info's `torch_compile` state per request.

    python benchmarks/compile_serving.py --model DIR [--tokens 64] [--threads 2] -- --context-length 16384 \
        --max-running-requests 8 --enable-torch-compile [--torch-compile-in-background]

Everything after `--` goes to the server. Set TORCHINDUCTOR_CACHE_DIR to choose a cold or a warm cache.
Prints one line per request (seconds since launch, compile state before it, tok/s) and a summary.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent


def rss_mib(pid: int) -> str:
    """The server's resident (VmRSS) and peak (VmHWM) MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return f"RSS {int(fields['VmRSS'].split()[0]) / 1024:.0f} MiB (peak {int(fields['VmHWM'].split()[0]) / 1024:.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--after", type=int, default=5, help="requests once compiled")
    ap.add_argument("--log", type=Path, default=Path("compile_serving.log"))
    ap.add_argument("server_args", nargs="*")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE / "peers"))
    from engines import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(a.model), "--host", "127.0.0.1", "--port", str(port),
           "--num-threads", str(a.threads), *a.server_args]  # fmt: skip
    t0 = time.monotonic()
    with open(a.log, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=HERE.parent)
    rng = random.Random(0)
    rows: list[tuple[float, str, float]] = []
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited {proc.returncode}; log {a.log}")
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        healthy = time.monotonic() - t0
        print(f"healthy after {healthy:.1f} s (load average {os.getloadavg()}), {rss_mib(proc.pid)}", flush=True)
        after = 0
        while after < a.after:
            state = client.get("/server_info").json()["internal_states"][0]["torch_compile"]
            ids = [rng.randrange(10, 4000) for _ in range(16)]
            params = {"temperature": 0.0, "max_new_tokens": a.tokens, "ignore_eos": True}
            s = time.monotonic()
            r = client.post("/generate", json={"input_ids": ids, "sampling_params": params})
            r.raise_for_status()
            rate = a.tokens / (time.monotonic() - s)
            rows.append((s - t0, state, rate))
            print(f"t={s - t0:7.1f} s  {state:14s} {rate:7.1f} tok/s", flush=True)
            after += state != "compiling"
        time.sleep(2.0)
        print(f"idle after the requests: {rss_mib(proc.pid)}", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    by_state: dict[str, list[float]] = {}
    for _, state, rate in rows:
        by_state.setdefault(state, []).append(rate)
    first_compiled = next((t for t, state, _ in rows if state != "compiling"), None)
    print(f"summary: healthy {healthy:.1f} s; first request on the compiled path at {first_compiled} s; " + "; ".join(
        f"{state}: median {statistics.median(v):.1f} tok/s over {len(v)} requests" for state, v in by_state.items()
    ))  # fmt: skip


if __name__ == "__main__":
    main()
