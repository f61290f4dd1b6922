"""The process layout (`--engine-process`): the engine in a child process of the HTTP server, over loopback.

What crosses the process boundary is checked through the real HTTP API: generate (stream and not), OpenAI chat,
abort mid-stream, structured output (grammars compiled in the engine process), /metrics and /health from the
stats the engine process sends, greedy output token-identical to the one-process layout. And the lifecycle:
the engine process killed -> /health fails and the server exits 1; SIGTERM -> no engine process left; the
server killed -> its engine process stops by itself; PD with --engine-process refused at start-up, one line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import REPO_ROOT, RunningServer, free_port, start_runtime_server

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the child process")

FLAGS = ("--engine-process", "--enable-metrics", "--memory-budget-gib", "1")
PROMPTS = ["The capital city of France is", "1, 2, 3, 4,", "def fibonacci(n):", "Once upon a time"]


def engine_children(pid: int) -> list[int]:
    """The server's child processes (the engine process in this layout)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out.extend(int(c) for c in task.read_text().split())
        except OSError:
            continue
    return out


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def server(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with start_runtime_server(demo_model_dir, *FLAGS, log_dir=tmp_path_factory.mktemp("engine-process")) as s:
        yield s


def _greedy(url: str, text: str, stream: bool = False) -> list[int]:
    body = {"text": text, "stream": stream,
            "sampling_params": {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}}  # fmt: skip
    if not stream:
        r = httpx.post(url + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        ids: list[int] = r.json()["output_ids"]
        return ids
    last: dict = {}
    with httpx.stream("POST", url + "/generate", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[6:])
    return list(last["output_ids"])


def test_the_engine_runs_in_a_child_process(server: RunningServer) -> None:
    children = engine_children(server.process.pid)
    assert len(children) == 1, children
    cmdline = Path(f"/proc/{children[0]}/cmdline").read_bytes().split(b"\0")
    assert b"runtime.engine.engine_worker" in cmdline
    assert "Engine process started (pid" in server.log_text()


def test_greedy_is_token_identical_to_the_one_process_layout(
    server: RunningServer, runtime_server: RunningServer
) -> None:
    for text in PROMPTS:
        reference = _greedy(runtime_server.url, text)
        assert len(reference) == 24
        assert _greedy(server.url, text) == reference, text
        assert _greedy(server.url, text, stream=True) == reference, text


def test_concurrent_requests_each_get_their_own_outputs(server: RunningServer) -> None:
    expected = {text: _greedy(server.url, text) for text in PROMPTS}
    results: dict[str, list[int]] = {}

    def run(text: str) -> None:
        results[text] = _greedy(server.url, text, stream=True)

    threads = [threading.Thread(target=run, args=(t,)) for t in PROMPTS * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == expected


def test_openai_chat_stream_and_not(server: RunningServer) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["usage"]["completion_tokens"] >= 1
    pieces: list[str] = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        for choice in json.loads(line[6:])["choices"]:
            pieces.append(choice["delta"].get("content") or "")
    assert "".join(pieces) == answer["choices"][0]["message"]["content"]


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    match = re.search(rf"^sglang:{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_abort_mid_stream_frees_the_request_in_the_engine(server: RunningServer) -> None:
    aborted_before = _metric(server.url, "num_aborted_requests_total")
    body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True}}
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as r:
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
            if chunks == 3:
                break  # hang up mid-stream
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (
            _metric(server.url, "num_aborted_requests_total") > aborted_before
            and _metric(server.url, "num_running_reqs") == 0
        ):
            break
        time.sleep(0.1)
    assert _metric(server.url, "num_aborted_requests_total") == aborted_before + 1
    assert _metric(server.url, "num_running_reqs") == 0
    assert _metric(server.url, "token_usage") == 0


def test_metrics_health_and_server_info_read_the_engine_process_stats(server: RunningServer) -> None:
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    before = _metric(server.url, "generation_tokens_total")
    _greedy(server.url, "Hello there")
    deadline = time.monotonic() + 60
    while _metric(server.url, "generation_tokens_total") < before + 24 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metric(server.url, "generation_tokens_total") >= before + 24
    info = httpx.get(server.url + "/server_info", timeout=30).json()
    assert info["engine_process"] is True
    assert info["max_total_num_tokens"] > 0 and info["context_length"] > 0
    assert "disable_radix_cache" in info  # the engine's resolved options came across
    flushed = httpx.post(server.url + "/flush_cache", timeout=30)
    assert flushed.status_code == 200, flushed.text


def test_structured_output_compiles_in_the_engine_process(server: RunningServer) -> None:
    body = {"text": ["Answer:", "Code:"],
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 16, "regex": r"[0-9]{3}-[a-z]{2}"}}  # fmt: skip
    r = httpx.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    for out in r.json():
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", out["text"]), out["text"]
    bad = {"text": "x", "sampling_params": {"max_new_tokens": 4, "json_schema": "{not json"}}
    r = httpx.post(server.url + "/generate", json=bad, timeout=120)
    assert r.status_code == 400, r.text


def test_killed_engine_process_fails_health_and_the_server_exits(demo_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(demo_model_dir), "--host", "127.0.0.1", "--port",
           str(port), "--memory-budget-gib", "0.5", "--engine-process"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        (child,) = engine_children(proc.pid)
        lines: list[str] = []

        def stream() -> None:
            body = {"input_ids": [1, 2, 3], "stream": True,
                    "sampling_params": {"max_new_tokens": 20000, "ignore_eos": True}}  # fmt: skip
            try:
                with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
                    lines.extend(line for line in r.iter_lines() if line)
            except httpx.TransportError:
                lines.append("<connection closed>")

        reader = threading.Thread(target=stream)
        reader.start()
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(child, signal.SIGKILL)
        codes: set[int] = set()
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                codes.add(httpx.get(url + "/health", timeout=5).status_code)
            except httpx.TransportError:
                codes.add(-1)
            time.sleep(0.05)
        assert proc.wait(timeout=60) == 1, log.read_text()
        reader.join(timeout=30)
        assert codes & {503, -1}, codes
        text = log.read_text()
        assert "engine loop died: the engine process was killed by signal 9" in text or (
            "the engine process was killed by signal 9" in text
        ), text
        # The open stream ended with the engine's failure, not a hang.
        assert "The engine stopped" in "".join(lines) or "<connection closed>" in lines, lines[-3:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_leaves_no_engine_process(demo_model_dir: Path) -> None:
    with start_runtime_server(demo_model_dir, "--engine-process", "--memory-budget-gib", "0.5") as server:
        (child,) = engine_children(server.process.pid)
        assert _alive(child)
    # start_runtime_server sent SIGTERM and checked exit code 0.
    assert _wait_gone(child, 10), f"engine process {child} outlived its server"


def test_a_killed_server_leaves_no_engine_process(demo_model_dir: Path) -> None:
    with start_runtime_server(demo_model_dir, "--engine-process", "--memory-budget-gib", "0.5") as server:
        (child,) = engine_children(server.process.pid)
        server.process.kill()
        server.process.wait(timeout=30)
        # Its end of the socket closed: the engine process stops by itself (reparented, so poll /proc).
        assert _wait_gone(child, 30), f"engine process {child} outlived its killed server"
        server.process.returncode = 0  # killed on purpose: start_runtime_server checks for a clean exit


def test_engine_process_with_pd_is_refused_in_one_line(demo_model_dir: Path) -> None:
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(demo_model_dir), "--engine-process",
           "--disaggregation-mode", "prefill"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1, r.stderr
    assert "--engine-process with --disaggregation-mode prefill" in r.stderr
    assert "Traceback" not in r.stderr


def test_frames_split_anywhere_reassemble_in_order() -> None:
    """A stream socket hands over any split of the frames; the reader yields each message once, in order."""
    from runtime.core.requests import EngineStats, RequestOutput
    from runtime.engine.wire import STEP, FrameReader, frame, outputs, rows, stats_row

    sent = [RequestOutput(f"r{i}", [i, i + 1], i % 2 == 0, None, 10, i, 0) for i in range(5)]
    stats = EngineStats(num_running_reqs=3, token_usage=0.25, mamba_radix_cache_strategy="extra_buffer")
    data = frame((STEP, rows(sent[:2]), stats_row(stats), None)) + frame((STEP, rows(sent[2:]), None, "boom"))
    for piece in (1, 7, len(data)):
        reader = FrameReader()
        got = [m for i in range(0, len(data), piece) for m in reader.feed(data[i : i + piece])]
        assert [m[0] for m in got] == [STEP, STEP]
        assert outputs(got[0][1]) + outputs(got[1][1]) == sent
        assert EngineStats(*got[0][2]) == stats
        assert got[1][2] is None and got[1][3] == "boom"
