"""Warm/cold TTFT of the bundled runtime's prefix cache across document lengths, as a markdown table.

Starts `python -m runtime` on the model directory (build one: `python -m runtime.demo_model --out DIR`),
runs `hybridctl verify prefix-cache --json` once per document length, stops the server, prints the table.

    python benchmarks/prefix_cache_sweep.py --model-path DIR [--doc-tokens 256 512 1024 2048] [--trials 3]
        [-- extra runtime flags, e.g. --mamba-radix-cache-strategy no_buffer]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the runtime exited with code {proc.returncode} before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"the runtime was not healthy after {timeout_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--doc-tokens", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("runtime_args", nargs="*", help="extra flags for python -m runtime (after --)")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "runtime", "--model-path", args.model_path, "--port", str(port),
           "--enable-metrics", *args.runtime_args]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_healthy(url, proc)
        for n in args.doc_tokens:
            out = subprocess.run(
                [sys.executable, "-m", "hybridctl", "verify", "prefix-cache", "--url", url, "--json",
                 "--doc-tokens", str(n), "--trials", str(args.trials)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            check = json.loads(out.stdout)["checks"][0]
            m = check["measurements"]
            real, ident = m["realistic"], m["identical"]
            ratio = real["ratio"]
            cached = min(r[-1] for r in real["cached_tokens"])
            rows.append(
                f"| {n} | {m['cold_ttft_ms']['median']:.1f} | {real['warm_ttft_ms']['median']:.1f} "
                f"| {ratio['ratio']:.2f} ({ratio['ci_low']:.2f}-{ratio['ci_high']:.2f}) "
                f"| {ident['ratio']['ratio']:.2f} | {cached} | {check['status']} |"
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"`python benchmarks/prefix_cache_sweep.py --model-path DIR --trials {args.trials}"
          f"{' -- ' + ' '.join(args.runtime_args) if args.runtime_args else ''}`\n")  # fmt: skip
    print("| document tokens | cold median TTFT (ms) | warm median (ms) | warm/cold (95% CI) | identical | "
          "min cached | verdict |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
