"""`--torch-compile-in-background` over loopback: the server is healthy and serves eager while its compiled
forwards are built, /server_info says which path runs (never "compiled" before it is), and greedy outputs are the
same token for token before and after the compiled forwards are swapped in."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import RunningServer, start_runtime_server

# Builds the demo model's graphs with the flags of test_torch_compile.py's fixture, so it runs after that module
# (the file name sorts after it) and loads the graphs from inductor's cache instead of compiling them again.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
PROMPTS = [[17, 305, 2048, 9, 77], [1000 + i for i in range(40)], [42]]


def _compile_state(client: httpx.Client) -> str:
    return str(client.get("/server_info").json()["internal_states"][0]["torch_compile"])


def _outputs(client: httpx.Client) -> list[list[int]]:
    out = []
    for ids in PROMPTS:
        r = client.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY})
        assert r.status_code == 200, r.text
        out.append(r.json()["output_ids"])
    return out


def _wait_compiled(client: httpx.Client, server: RunningServer, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while (state := _compile_state(client)) == "compiling":
        assert time.monotonic() < deadline, f"still compiling after {timeout_s} s; log {server.log_path}"
        time.sleep(1.0)
    return state


def test_serves_eager_while_compiling_then_compiled_with_identical_output(demo_model_dir: Path) -> None:
    flags = ["--enable-torch-compile", "--torch-compile-in-background", "--torch-compile-max-bs", "4",
             "--torch-compile-max-extend-tokens", "16", "--memory-budget-gib", "0.2",
             "--native-decode", "off"]  # fmt: skip
    with start_runtime_server(demo_model_dir, *flags) as server, httpx.Client(base_url=server.url, timeout=300) as c:
        # Healthy at once: tracing alone takes longer than the server's start, even from a warm cache.
        assert _compile_state(c) == "compiling"
        before = _outputs(c)
        assert _compile_state(c) == "compiling", "compiled before the eager requests finished: nothing compared"
        assert _wait_compiled(c, server, 1500) == "decode+extend"
        after = _outputs(c)
        again = _outputs(c)  # the prefix cache hit: compiled extends of the short tails
        log = server.log_path.read_text()
    assert before == after == again
    assert all(len(o) == GREEDY["max_new_tokens"] for o in before)
    assert "background compile done" in log and "decode compiled" in log


def test_without_compile_the_path_is_off(runtime_server: RunningServer) -> None:
    assert _compile_state(httpx.Client(base_url=runtime_server.url, timeout=30)) == "off"
