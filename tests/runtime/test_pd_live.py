"""PD disaggregation on real servers: `python -m runtime --disaggregation-mode prefill|decode` + PD router.

Greedy output through prefill -> decode (via hybridctl's router) is token-identical to one server computing
the whole request; a transfer cut off mid-payload, and a decode server killed mid-transfer, leave the prefill
side's pools and transfer accounting whole; mismatched layouts fail the request with the doctor's message.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runtime.pd.prefill import fetch_stats
from runtime.pd.protocol import MISMATCH, recv_exact, recv_json, send_json
from tests.runtime.conftest import REPO_ROOT, RunningServer, free_port, start_runtime_server

FLAGS = ("--memory-budget-gib", "0.5", "--enable-metrics")
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 6,
    "Once upon a time, in a land far away, there lived a",
    "Line 1: alpha beta gamma delta. Line 2: epsilon zeta eta theta. Line 3:",
]


@dataclass
class Trio:
    prefill: RunningServer
    decode: RunningServer
    router_url: str
    bootstrap_port: int


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"process exited with {proc.returncode}"
        try:
            if httpx.get(url + "/health", timeout=30).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not healthy after {timeout_s}s")


@pytest.fixture(scope="module")
def trio(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trio]:
    logs, bootstrap = tmp_path_factory.mktemp("pd-logs"), free_port()
    prefill_flags = (*FLAGS, "--disaggregation-mode", "prefill")
    prefill_flags += ("--disaggregation-bootstrap-port", str(bootstrap))
    decode_flags = (*FLAGS, "--disaggregation-mode", "decode")
    with (
        start_runtime_server(demo_model_dir, *prefill_flags, log_dir=logs) as prefill,
        start_runtime_server(demo_model_dir, *decode_flags, log_dir=logs) as decode,
    ):
        port = free_port()
        cmd = [sys.executable, "-m", "hybridctl.launch.pd_router", "--prefill", prefill.url, str(bootstrap),
               "--decode", decode.url, "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        with open(logs / "router.log", "wb") as log:
            router = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        try:
            _wait_http(f"http://127.0.0.1:{port}", router)
            yield Trio(prefill, decode, f"http://127.0.0.1:{port}", bootstrap)
        finally:
            router.send_signal(signal.SIGTERM)
            router.wait(timeout=30)


def generate(url: str, text: str, max_new_tokens: int = 12, **extra: object) -> httpx.Response:
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}, **extra}
    return httpx.post(url + "/generate", json=body, timeout=120)


def transfer_stats(trio: Trio) -> dict[str, int]:
    return fetch_stats("127.0.0.1", trio.bootstrap_port)


def settled(trio: Trio, ok: object) -> dict[str, int]:
    """The prefill side's counters once `ok(stats)` holds (its connection threads read acks asynchronously).
    The polls here wait up to 60 s: a condition that holds returns at once; a loaded host may take seconds."""
    deadline = time.monotonic() + 60
    while not ok(stats := transfer_stats(trio)):  # type: ignore[operator]
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    return stats


def routing_fields(trio: Trio, room: int) -> dict[str, object]:
    return {"bootstrap_host": "127.0.0.1", "bootstrap_port": trio.bootstrap_port, "bootstrap_room": room}


def pools_idle(server: RunningServer) -> dict[str, int]:
    state = httpx.get(server.url + "/server_info", timeout=30).json()["internal_states"][0]
    return {k: state[k] for k in ("kv_pages_in_use", "state_slots_in_use", "num_running_reqs")}


def test_pd_output_is_token_identical_to_one_server(trio: Trio) -> None:
    # The reference: the decode server computes each whole request itself (no routing fields), cache flushed.
    reference = [generate(trio.decode.url, p).json()["output_ids"] for p in PROMPTS]
    assert httpx.post(trio.decode.url + "/flush_cache", timeout=30).status_code == 200
    with ThreadPoolExecutor(3) as pool:  # concurrently: continuous batching on both sides
        answers = list(pool.map(lambda p: generate(trio.router_url, p), PROMPTS))
    assert [a.status_code for a in answers] == [200] * len(PROMPTS), [a.text for a in answers]
    assert [a.json()["output_ids"] for a in answers] == reference
    # Streaming through the router: the same tokens, chunk by chunk.
    body = {"text": PROMPTS[0], "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 12}}
    with httpx.stream("POST", trio.router_url + "/generate", json=body, timeout=120) as res:
        events = [json.loads(line[6:]) for line in res.iter_lines() if line.startswith("data: {")]
    assert events[-1]["output_ids"] == reference[0]
    # The OpenAI route is PD-routed too.
    res = httpx.post(trio.router_url + "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 12,
                     "temperature": 0}, timeout=120)  # fmt: skip
    assert res.status_code == 200 and res.json()["usage"]["completion_tokens"] == 12
    # A prompt the prefill server has cached: the decode server's answer reports the prefill side's hit.
    again = generate(trio.router_url, PROMPTS[0]).json()
    assert again["output_ids"] == reference[0] and again["meta_info"]["cached_tokens"] > 0
    stats = settled(trio, lambda st: st["pending"] == 0)
    assert stats["delivered"] == stats["rooms_total"] >= 5
    assert pools_idle(trio.prefill) == pools_idle(trio.decode) == {
        "kv_pages_in_use": 0, "state_slots_in_use": 0, "num_running_reqs": 0}  # fmt: skip


def _fetch_raw(port: int, room: int, cut_after: int | None) -> bytes | None:
    """Speak the decode side of the protocol by hand; `cut_after`: hang up after that many payload bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        send_json(sock, {"op": "fetch", "room": room})
        head = recv_json(sock)
        assert head["status"] == "ok", head
        send_json(sock, {"op": "accept"})
        if cut_after is not None:
            recv_exact(sock, cut_after)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            return None  # closed with RST mid-payload
        payload = recv_exact(sock, head["payload_bytes"])
        send_json(sock, {"op": "ack"})
        return payload


def test_dropped_connection_mid_transfer_is_retried_and_leaks_nothing(trio: Trio) -> None:
    before = fetch_stats("127.0.0.1", trio.bootstrap_port)
    room = secrets.randbits(63)
    res = generate(trio.prefill.url, PROMPTS[0], 8, bootstrap_host="127.0.0.1",
                   bootstrap_port=trio.bootstrap_port, bootstrap_room=room)  # fmt: skip
    assert res.status_code == 200 and len(res.json()["output_ids"]) == 1  # prefill computes the first token
    assert _fetch_raw(trio.bootstrap_port, room, cut_after=1000) is None
    deadline = time.monotonic() + 60
    while transfer_stats(trio)["dropped_connections"] == before["dropped_connections"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    mid = fetch_stats("127.0.0.1", trio.bootstrap_port)
    assert mid["pending"] == before["pending"] + 1  # the staged prefill waits for a retry
    assert pools_idle(trio.prefill)["state_slots_in_use"] == 0  # staging never holds a pool slot
    assert _fetch_raw(trio.bootstrap_port, room, cut_after=None)
    deadline = time.monotonic() + 60  # the ack is read by the prefill side's connection thread
    while (after := transfer_stats(trio))["delivered"] == before["delivered"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert after["delivered"] == before["delivered"] + 1 and after["pending"] == before["pending"]


def _connected_to(pid: int, port: int) -> bool:
    """Whether process `pid` holds an established TCP connection to local port `port` (Linux /proc)."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            sockets.add(target[len("socket:[") : -1])
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()  # sl local remote st ... inode
            if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in sockets:
                return True
    return False


def test_decode_killed_mid_transfer_then_a_fresh_decode_finishes_the_request(
    trio: Trio, demo_model_dir: Path, tmp_path: Path
) -> None:
    before = fetch_stats("127.0.0.1", trio.bootstrap_port)
    port = free_port()
    log = tmp_path / "doomed-decode.log"
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(demo_model_dir), "--port", str(port), *FLAGS,
           "--disaggregation-mode", "decode"]  # fmt: skip
    with open(log, "wb") as out:
        doomed = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        _wait_http(f"http://127.0.0.1:{port}", doomed, timeout_s=180)
        room = secrets.randbits(63)
        routing = routing_fields(trio, room)
        with ThreadPoolExecutor(1) as pool:
            # The decode side connects first and waits for the room: its transfer is in flight when it dies.
            pending = pool.submit(generate, f"http://127.0.0.1:{port}", PROMPTS[2], 12, **routing)
            # Killed once its fetch is connected (a fixed sleep could kill it before it connected on a loaded
            # host: then nothing was in flight and the prefill side had nothing to notice).
            deadline = time.monotonic() + 60
            while not _connected_to(doomed.pid, trio.bootstrap_port):
                assert doomed.poll() is None and not pending.done(), "the decode server ended before it fetched"
                assert time.monotonic() < deadline, "the decode server never connected to the bootstrap port"
                time.sleep(0.02)
            doomed.kill()
            doomed.wait(timeout=30)
            with pytest.raises(httpx.TransportError):
                pending.result()
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(timeout=30)
    res = generate(trio.prefill.url, PROMPTS[2], 12, **routing)
    assert res.status_code == 200
    deadline = time.monotonic() + 60
    while transfer_stats(trio)["dropped_connections"] == before["dropped_connections"]:
        assert time.monotonic() < deadline, "the prefill side never noticed the dead decode server"
        time.sleep(0.05)
    assert fetch_stats("127.0.0.1", trio.bootstrap_port)["pending"] == before["pending"] + 1
    assert pools_idle(trio.prefill) == {"kv_pages_in_use": 0, "state_slots_in_use": 0, "num_running_reqs": 0}
    # A decode server that is up fetches the same room: the request completes, nothing is left over.
    finished = generate(trio.decode.url, PROMPTS[2], 12, **routing)
    assert finished.status_code == 200, finished.text
    reference = generate(trio.prefill.url, PROMPTS[2], 12).json()["output_ids"]
    assert finished.json()["output_ids"] == reference
    after = settled(trio, lambda st: st["delivered"] == before["delivered"] + 1)
    assert after["pending"] == before["pending"]
    assert after["rooms_total"] == after["delivered"] + after["failed"] + after["expired"] + after["pending"]
    assert pools_idle(trio.decode) == {"kv_pages_in_use": 0, "state_slots_in_use": 0, "num_running_reqs": 0}


def test_mismatched_state_layout_fails_the_request_and_the_doctor_names_it(
    trio: Trio, demo_model_dir: Path, tmp_path: Path
) -> None:
    before = fetch_stats("127.0.0.1", trio.bootstrap_port)
    with start_runtime_server(
        demo_model_dir, *FLAGS, "--disaggregation-mode", "decode", "--mamba-ssm-dtype", "bfloat16",
        log_dir=tmp_path,
    ) as other:  # fmt: skip
        room = secrets.randbits(63)
        routing = routing_fields(trio, room)
        with ThreadPoolExecutor(2) as pool:
            decoded = pool.submit(generate, other.url, PROMPTS[1], 8, **routing)
            prefilled = pool.submit(generate, trio.prefill.url, PROMPTS[1], 8, **routing)
            assert prefilled.result().status_code == 200
            res = decoded.result()
        assert res.status_code == 503
        message = res.json()["error"]["message"]
        assert MISMATCH in message and "bfloat16" in message and "float32" in message and "Fix:" in message
        assert pools_idle(other) == {"kv_pages_in_use": 0, "state_slots_in_use": 0, "num_running_reqs": 0}
        log_path = other.log_path
    after = settled(trio, lambda st: st["failed"] == before["failed"] + 1)
    assert after["pending"] == before["pending"]
    doctor = subprocess.run(
        [sys.executable, "-m", "hybridctl", "doctor", "--no-host", "--log", str(log_path), "--json",
         "--config", str(tmp_path / "absent.toml")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert "PD_STATE_MISMATCH" in doctor.stdout, doctor.stdout + doctor.stderr
