"""No single request can wedge, crash, slow or expose the server: a fuzz of malformed requests over the OpenAI and
native routes gets 4xx JSON (never a 500, never a hang) while a greedy stream next to them keeps its exact
tokens; /health stays fast while an 8 MB body is refused; /flush_cache?timeout=N waits; the key comes from an
environment variable, never argv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import REPO_ROOT, RunningServer, free_port, start_runtime_server

GREEDY_STREAM = {"text": "The quick brown fox", "sampling_params": {"temperature": 0, "max_new_tokens": 48,
                                                                    "ignore_eos": True}, "stream": True}  # fmt: skip
NAN = b"NaN"
INF = b"Infinity"


@pytest.fixture(scope="module")
def server(demo_model_dir: Path) -> Iterator[RunningServer]:
    with start_runtime_server(demo_model_dir, "--memory-budget-gib", "0.5") as s:
        yield s


def _raw(body: str | bytes) -> bytes:
    return body if isinstance(body, bytes) else body.encode()


def malformed_requests() -> list[tuple[str, str, dict[str, str], bytes]]:
    """(method, path, headers, body): >= 80 requests a client could send by mistake or on purpose."""
    js = {"content-type": "application/json"}
    out: list[tuple[str, str, dict[str, str], bytes]] = []

    def post(path: str, body: object | bytes, headers: dict[str, str] | None = None) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        out.append(("POST", path, {**js, **(headers or {})}, raw))

    # Sampling numbers: types, ranges, non-finite, huge seeds, on the native route ...
    bad_values: list[tuple[str, object | bytes]] = [
        ("temperature", "hot"), ("temperature", -1), ("temperature", True), ("temperature", [1]),
        ("top_p", 0), ("top_p", 1.5), ("top_p", -0.1), ("top_k", 0), ("top_k", -5), ("top_k", 1.5),
        ("min_p", 2), ("min_p", -1), ("max_new_tokens", -1), ("max_new_tokens", 10**30),
        ("max_new_tokens", 1.5), ("max_new_tokens", "8"), ("sampling_seed", 2**64), ("sampling_seed", -(2**70)),
        ("sampling_seed", 10**400), ("sampling_seed", 1.5), ("frequency_penalty", 2.5), ("n", 0),
        ("stop", 5), ("stop", [1, 2]), ("stop_token_ids", ["a"]), ("ignore_eos", "yes"), ("min_new_tokens", 500),
        ("stream_interval", "x"), ("logit_bias", {"x": 100}), ("logit_bias", {"1": "a"}),
        ("logit_bias", {"99999999": 1}), ("repetition_penalty", 0), ("presence_penalty", -3), ("n", 10**6),
        ("no_such_param", 1),
        ("regex", "[a-"), ("regex", 5), ("json_schema", "{not json"), ("json_schema", '{"type": "no-such-type"}'),
        ("ebnf", "root ::= undefined_rule"),
    ]  # fmt: skip
    for key, value in bad_values:
        post("/generate", {"text": "hi", "sampling_params": {key: value}})
    for key in ("temperature", "top_p", "min_p"):
        for special in (NAN, INF, b"-Infinity"):
            post("/generate", b'{"text": "hi", "sampling_params": {"' + key.encode() + b'": ' + special + b"}}")
    # ... and on the OpenAI routes, with OpenAI's names.
    openai_bad: list[tuple[str, object]] = [
        ("seed", 2**64), ("seed", 2**100), ("seed", "abc"), ("max_tokens", -1), ("max_tokens", 10**9),
        ("max_tokens", "ten"), ("temperature", -2), ("top_p", 7), ("top_k", 0), ("n", 0), ("logprobs", -1),
        ("stream", "yes"), ("frequency_penalty", 3.0), ("min_tokens", 300), ("response_format", {"type": "xml"}),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}),
    ]  # fmt: skip
    for key, value in openai_bad:
        post("/v1/completions", {"prompt": "hi", key: value})
        post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], key: value})
    post("/v1/completions", b'{"prompt": "hi", "temperature": NaN}')
    post("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}')
    post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -4})
    # Prompts and messages of the wrong shape.
    for prompt in (None, 5, [], [[]], [1.5], [-1], [10**12], {"a": 1}, [True]):
        post("/v1/completions", {"prompt": prompt, "max_tokens": 2})
    for body in ({"text": 5}, {"text": []}, {"input_ids": "abc"}, {"input_ids": [-1]}, {"input_ids": [[1], "x"]},
                 {"text": "a", "input_ids": [1]}, {}, [], "text", 5, None, {"text": "hi", "rid": 5},
                 {"text": ["a", "b"], "rid": "same"}, {"text": "hi", "stream": "yes"},
                 {"text": "hi", "sampling_params": [1]}, {"text": "hi", "bootstrap_room": 2**70},
                 {"text": "hi", "bootstrap_port": 10**6}, {"text": "\ud800"}):  # fmt: skip
        post("/generate", body)
    for messages in ([{"role": 5, "content": "x"}], [{"role": "user", "content": 5}], [], "hi", [1],
                     [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                     [{"role": "user", "content": [{"type": "text", "text": 5}]}],
                     [{"content": "no role"}], [{"role": "user", "content": {"a": 1}}]):  # fmt: skip
        post("/v1/chat/completions", {"messages": messages, "max_tokens": 2})
    # Not JSON, deeply nested, huge.
    for raw in (b"", b"{", b"\xff\xfe", b"nul", b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 5000 + b"1" + b"}" * 5000):
        post("/generate", raw)
        post("/v1/chat/completions", raw)
    post("/generate", {"text": "x" * (3 << 20)})
    post("/v1/completions", {"prompt": [1] * 1_500_000})
    # Bad headers: non-ASCII and odd Authorization values (no key here: ignored; the key test sends them to a
    # server with a key), a wrong content type; each with a bad body so the answer must still be a 400.
    bad_body = json.dumps({"text": "hi", "sampling_params": {"top_p": 0}}).encode()
    for auth in ("Bearer \u00e9\u00e8", "Bearer", "\u00ff" * 50, "Basic Zm9v"):
        out.append(("POST", "/generate", {**js, "authorization": auth}, bad_body))
    out.append(("POST", "/generate", {"content-type": "text/plain; charset=\u00e9"}, bad_body))
    # Wrong methods and unknown routes.
    wrong = [("GET", "/generate"), ("DELETE", "/generate"), ("GET", "/v1/completions"),
             ("PUT", "/v1/chat/completions"), ("POST", "/health"), ("POST", "/v1/models"),
             ("GET", "/no/such/route"), ("POST", "/v2/completions"), ("PATCH", "/flush_cache")]  # fmt: skip
    for method, path in wrong:
        out.append((method, path, js, b""))
    for timeout in ("abc", "-1", "nan", "inf"):
        out.append(("POST", f"/flush_cache?timeout={timeout}", js, b""))
    return out


def _send(url: str, method: str, path: str, headers: dict[str, str], body: bytes) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=60.0) as client:
        # As UTF-8 bytes: httpx refuses non-ASCII header values given as str.
        raw = [(k.encode("ascii"), v.encode("utf-8")) for k, v in headers.items()]
        return client.send(client.build_request(method, path, content=body, headers=raw))


def _stream_tokens(client: httpx.Client) -> list[int]:
    ids: list[int] = []
    with client.stream("POST", "/generate", json=GREEDY_STREAM) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ids = json.loads(line[6:])["output_ids"]
    return ids


def test_fuzz_gets_json_4xx_and_a_greedy_stream_beside_it_is_unchanged(server: RunningServer) -> None:
    requests = malformed_requests()
    assert len(requests) >= 80
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        solo = _stream_tokens(client)
        assert len(solo) == 48
        beside: list[list[int]] = []
        stop = threading.Event()

        def stream_loop() -> None:
            with httpx.Client(base_url=server.url, timeout=120.0) as c:
                while not stop.is_set():
                    beside.append(_stream_tokens(c))

        streamer = threading.Thread(target=stream_loop, daemon=True)
        streamer.start()
        failures: list[str] = []
        for method, path, headers, body in requests:
            r = _send(server.url, method, path, headers, body)
            shown = f"{method} {path} {body[:80]!r}"
            if not 400 <= r.status_code < 500:
                failures.append(f"{shown} -> {r.status_code} {r.text[:200]}")
            elif r.headers.get("content-type", "").split(";")[0] != "application/json":
                failures.append(f"{shown} -> {r.status_code} not JSON: {r.text[:200]}")
            elif "Traceback" in r.text:
                failures.append(f"{shown} -> traceback in body")
        stop.set()
        streamer.join(timeout=120)
        assert not failures, "\n".join(failures)
        assert beside, "the greedy stream never completed next to the fuzz"
        assert all(tokens == solo for tokens in beside), "a greedy stream changed next to bad requests"
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 200
        after = client.post("/generate", json={**GREEDY_STREAM, "stream": False})
        assert after.status_code == 200 and after.json()["output_ids"] == solo
    assert server.process.poll() is None


def test_errors_name_the_field_as_the_client_sent_it(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60.0) as c:
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        cases = [
            ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
            ("/v1/completions", {"prompt": "hi", "max_tokens": "x"}, "max_tokens"),
            ("/v1/completions", {"prompt": "hi", "seed": 2**64}, "seed"),
            ("/v1/completions", {"prompt": "hi", "min_tokens": 200}, "min_tokens"),
            ("/v1/chat/completions", {**chat, "max_completion_tokens": -1}, "max_completion_tokens"),
            ("/v1/chat/completions", {**chat, "max_tokens": 10**9}, "max_tokens"),
            ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
            ("/generate", {"text": "hi", "sampling_params": {"sampling_seed": 2**64}}, "sampling_seed"),
        ]
        for path, body, field in cases:
            r = c.post(path, json=body)
            assert r.status_code == 400, (path, body, r.text)
            data = r.json()
            message = data.get("message") or data["error"]
            message = message if isinstance(message, str) else message["message"]
            assert field in message, (path, body, message)
            if field in ("max_tokens", "max_completion_tokens", "seed", "min_tokens"):
                other = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
                         "seed": "sampling_seed", "min_tokens": "min_new_tokens"}[field]  # fmt: skip
                assert other not in message, (path, body, message)


def test_tool_call_history_with_null_content_is_served(server: RunningServer) -> None:
    messages = [
        {"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]  # fmt: skip
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


def _send_big(url: str, total: int, chunked: bool, done: threading.Event, status: list[int]) -> None:
    """POST a `total`-byte prompt: with Content-Length, or chunked (the server must count while it reads)."""

    def chunks() -> Iterator[bytes]:
        yield b'{"text": "'
        sent = 0
        while sent < total:
            yield b"a" * 65536
            sent += 65536
        yield b'"}'

    content: bytes | Iterator[bytes] = chunks() if chunked else b"".join(chunks())
    try:
        r = httpx.post(url + "/generate", content=content, headers={"content-type": "application/json"}, timeout=60)
        status.append(r.status_code)
    except httpx.TransportError:
        status.append(-1)  # the server may close the connection once it refused the body
    finally:
        done.set()


@pytest.mark.slow
def test_health_answers_fast_while_an_8mb_request_is_refused(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        assert c.get("/health").status_code == 200  # warm connection
        for chunked in (False, True):
            done, status, latencies = threading.Event(), [], []
            sender = threading.Thread(target=_send_big, args=(server.url, 8 << 20, chunked, done, status))
            sender.start()
            while not done.is_set() or len(latencies) < 5:
                t0 = time.perf_counter()
                assert c.get("/health").status_code == 200
                latencies.append(time.perf_counter() - t0)
            sender.join(timeout=60)
            assert status and status[0] in (413, -1), status
            latencies.sort()
            # A loop blocked on the body would stall /health for the whole upload (seconds); the bound leaves room
            # for a loaded 2-core host (medians of 0.10-0.11 s were seen at load 12), not a speed claim.
            assert latencies[len(latencies) // 2] < 0.3, f"median /health {latencies[len(latencies) // 2]:.3f}s"


@pytest.mark.slow
def test_health_answers_while_a_long_prompt_is_tokenized(server: RunningServer) -> None:
    """A prompt just under the body limit is tokenized (then refused: longer than the context) on a worker thread
    that lets go of the GIL: the event loop answers /health meanwhile (tokenizers' single `encode` held the GIL
    for the whole call: the loop stood still for ~1 s here)."""
    text = ("hello world, this is a test. " * 40000)[:1_000_000]
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 1}}).encode()
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        assert c.get("/health").status_code == 200
        done, status, latencies, request_s = threading.Event(), [], [], []

        def send() -> None:
            t0 = time.perf_counter()
            try:
                status.append(httpx.post(server.url + "/generate", content=body, timeout=120).status_code)
            finally:
                request_s.append(time.perf_counter() - t0)
                done.set()

        sender = threading.Thread(target=send)
        sender.start()
        while not done.is_set() or len(latencies) < 5:
            t0 = time.perf_counter()
            assert c.get("/health").status_code == 200
            latencies.append(time.perf_counter() - t0)
        sender.join(timeout=120)
    assert status == [400]
    latencies.sort()
    # The GIL-holding encode stalled the loop ~1-1.75 s; the bounds sit well under that and above what a loaded
    # 2-core host gives (medians of 0.10-0.11 s at load 12).
    assert latencies[len(latencies) // 2] < 0.3, f"/health latencies {latencies[-3:]}"
    # The stall is one /health wait over ~85-95% of the request's own time: 0.77-0.90 s of 0.90-1.01 s on a quiet
    # 2-core host (a fixed 0.9 s bar missed it there), 1.33-1.71 s of 1.60-1.96 s with a core spinning, 2.71 s of
    # 2.88 s under more load. A loop that stays free waits at most ~6% of it (0.04-0.08 s of 1.5-2.7 s; 0.28 s of
    # 4.68 s with two spinning processes), so the bar is half the request's time, and never under 0.3 s.
    longest, bar = latencies[-1], max(0.3, 0.5 * request_s[0])
    assert longest < bar, f"/health waited {longest:.2f} s of the request's {request_s[0]:.2f} s: {latencies[-3:]}"


def test_flush_cache_waits_up_to_its_timeout(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=360.0) as c:
        # 512 tokens (~0.8 s on a quiet 2-core host): the request still runs when the refusal below is asked for,
        # even if a loaded host stalls this process for a while (64 tokens, ~0.1 s, could end before the poll saw
        # it running, and the poll then never ended).
        params = {"temperature": 0, "max_new_tokens": 512, "ignore_eos": True}
        running = threading.Thread(
            target=lambda: c.post("/generate", json={"text": "flush me", "sampling_params": params})
        )
        running.start()
        deadline = time.monotonic() + 60
        while c.get("/server_info").json()["internal_states"][0]["num_running_reqs"] == 0:
            assert time.monotonic() < deadline, "the request never showed as running"
            time.sleep(0.01)
        # Without a timeout: refused at once while a request runs (SGLang's default).
        assert c.post("/flush_cache").status_code == 400
        # With one: waits for the request to finish, then flushes.
        r = c.post("/flush_cache", params={"timeout": 300})
        running.join()
        assert r.status_code == 200, r.text
        assert r.text.startswith("Cache flushed.")


def test_api_key_from_environment_variable(demo_model_dir: Path) -> None:
    key = "env-key-\u00e9-not-on-argv".encode().hex()
    env = {"HYBRID_TEST_KEY": key}
    args = ("--api-key-env", "HYBRID_TEST_KEY", "--memory-budget-gib", "0.5")
    with start_runtime_server(demo_model_dir, *args, env=env) as s, httpx.Client(base_url=s.url) as c:
        cmdline = Path(f"/proc/{s.process.pid}/cmdline").read_bytes().decode(errors="replace")
        assert key not in cmdline and "HYBRID_TEST_KEY" in cmdline
        body = {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 2}}
        assert c.post("/generate", json=body).status_code == 401
        assert c.post("/generate", json=body, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        bad = _send(s.url, "POST", "/generate", {"authorization": "Bearer \u00e9\u00e8"}, json.dumps(body).encode())
        assert bad.status_code == 401 and bad.json()
        info = c.get("/server_info", headers={"Authorization": f"Bearer {key}"})
        assert key not in info.text and info.json()["api_key_env"] == "HYBRID_TEST_KEY"
    assert key not in s.log_text()


def test_api_key_env_unset_is_a_clear_start_error(demo_model_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HYBRID_UNSET_KEY"}
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(demo_model_dir), "--api-key-env", "HYBRID_UNSET_KEY"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120)
    assert done.returncode == 2
    assert "HYBRID_UNSET_KEY" in done.stderr and "unset or empty" in done.stderr and "Traceback" not in done.stderr


_DIE_SCRIPT = """
import sys, threading, time, pathlib
from hybridshared.flags.runtime_parser import parse_args
from runtime.server.launch import serve, start_context
ctx = start_context(parse_args(sys.argv[2:]))
trigger = pathlib.Path(sys.argv[1])
def kill_engine_loop():
    while not trigger.exists():
        time.sleep(0.05)
    def boom(core):
        raise KeyboardInterrupt("injected: the engine loop dies")  # not an Exception: escapes the loop's guards
    try:
        ctx.client.call_in_engine(boom)
    except BaseException:
        pass
threading.Thread(target=kill_engine_loop, daemon=True).start()
sys.exit(serve(ctx))
"""


def test_a_dead_engine_loop_fails_health_and_exits_nonzero(demo_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    trigger = tmp_path / "kill"
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-c", _DIE_SCRIPT, str(trigger), "--model-path", str(demo_model_dir), "--host",
           "127.0.0.1", "--port", str(port), "--memory-budget-gib", "0.5"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        trigger.touch()
        codes: set[int] = set()
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                codes.add(httpx.get(url + "/ready", timeout=5).status_code)
                codes.add(httpx.get(url + "/health", timeout=5).status_code)
            except httpx.TransportError:
                codes.add(-1)  # gone already
            time.sleep(0.05)
        assert proc.wait(timeout=60) == 1, log.read_text()
        assert codes & {503, -1}, codes  # /health and /ready failed (or the process was already gone)
        assert "engine loop died" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
