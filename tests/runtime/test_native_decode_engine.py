"""The native decode inside the real engine and the real server: greedy tokens with `--native-decode` on equal the
torch decode's (`off`) over random prompts, batched and alone, with the prefix cache on, for Qwen3-Next and
Nemotron-H; the start-up log and /server_info say which decode path runs, and why not where it does not."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.requests import GenerateRequest
from runtime.engine.engine_core import EngineCore
from runtime.engine.pool_setup import EngineStartupError
from runtime.native.build import find_compiler
from tests.runtime.conftest import start_runtime_server
from tests.runtime.test_checkpoint_states import build_tiny_kimi_linear
from tests.runtime.test_engine_support import (
    VOCAB,
    build_tiny_nemotron_h,
    build_tiny_qwen3_next,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="needs a C compiler (CI installs gcc)")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_next(Path(tmp_path_factory.mktemp("qwen3_next")) / "model")


@pytest.fixture(scope="module")
def cores(model_dir: Path) -> dict[str, EngineCore]:
    return {
        "native": make_core(model_dir, chunked_prefill_size=7, mamba_track_interval=8),
        "torch": make_core(model_dir, chunked_prefill_size=7, mamba_track_interval=8, native_decode="off"),
    }


def test_native_is_the_default_decode_and_runs(cores: dict[str, EngineCore]) -> None:
    native, torch_core = cores["native"], cores["torch"]
    assert native.runner.native_decode is not None and native.stats().native_decode == "on"
    assert torch_core.runner.native_decode is None
    assert torch_core.stats().native_decode == "off: --native-decode off"
    before = native.runner.native_decode.steps
    run_to_completion(native, [GenerateRequest("probe", [5, 6, 7, 8], greedy(5))], together=True)
    assert native.runner.native_decode.steps - before >= 4  # every token after the first is a native step


token = st.integers(0, VOCAB - 2)
prompt_sets = st.lists(st.lists(token, min_size=1, max_size=40), min_size=1, max_size=5)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=prompt_sets, max_new=st.integers(2, 10), together=st.booleans())
def test_greedy_tokens_identical_to_the_torch_decode(
    cores: dict[str, EngineCore], prompts: list[list[int]], max_new: int, together: bool
) -> None:
    def reqs() -> list[GenerateRequest]:
        return [GenerateRequest(f"r{i}", p, greedy(max_new)) for i, p in enumerate(prompts)]

    want = run_to_completion(cores["torch"], reqs(), together=together)
    got = run_to_completion(cores["native"], reqs(), together=together)
    for i in range(len(prompts)):
        assert got.tokens(f"r{i}") == want.tokens(f"r{i}"), f"prompt {i} diverged"


@pytest.fixture(scope="module")
def nemotron_cores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, EngineCore]:
    model_dir = build_tiny_nemotron_h(Path(tmp_path_factory.mktemp("nemotron_h")) / "model")
    return {
        "native": make_core(model_dir, chunked_prefill_size=7, mamba_track_interval=8),
        "torch": make_core(model_dir, chunked_prefill_size=7, mamba_track_interval=8, native_decode="off"),
    }


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=prompt_sets, max_new=st.integers(2, 10), together=st.booleans())
def test_nemotron_h_greedy_tokens_identical_to_the_torch_decode(
    nemotron_cores: dict[str, EngineCore], prompts: list[list[int]], max_new: int, together: bool
) -> None:
    """The Mamba2 hybrid's decode steps and short extends (prefix-cache resumes included) run in C."""
    native = nemotron_cores["native"]
    assert native.runner.native_decode is not None and native.stats().native_decode == "on"
    before = native.runner.native_decode.steps

    def reqs() -> list[GenerateRequest]:
        return [GenerateRequest(f"r{i}", p, greedy(max_new)) for i, p in enumerate(prompts)]

    want = run_to_completion(nemotron_cores["torch"], reqs(), together=together)
    got = run_to_completion(native, reqs(), together=together)
    for i in range(len(prompts)):
        assert got.tokens(f"r{i}") == want.tokens(f"r{i}"), f"prompt {i} diverged"
    assert native.runner.native_decode.steps - before >= max_new - 1


def test_what_the_step_cannot_take_keeps_the_torch_decode_and_on_refuses(tmp_path: Path) -> None:
    model_dir = build_tiny_kimi_linear(tmp_path / "kimi")
    assert make_core(model_dir).runner.native_decode is not None  # KDA and MLA layers: native (test_native_decode_kimi)
    core = make_core(model_dir, mamba_ssm_dtype="bfloat16")
    assert core.runner.native_decode is None
    detail = core.stats().native_decode
    assert detail.startswith("off: ") and "ssm pool" in detail, detail
    with pytest.raises(EngineStartupError, match="--native-decode on, but it cannot run"):
        make_core(model_dir, mamba_ssm_dtype="bfloat16", native_decode="on")


def test_low_precision_state_pool_keeps_the_torch_decode(model_dir: Path) -> None:
    core = make_core(model_dir, mamba_ssm_dtype="bfloat16")
    assert core.runner.native_decode is None and "ssm pool" in core.stats().native_decode


def _greedy_text(url: str, prompt: str, n: int) -> str:
    body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}}
    return str(httpx.post(url + "/generate", json=body, timeout=120).json()["text"])


def test_live_servers_on_and_off_give_the_same_greedy_text(model_dir: Path, tmp_path: Path) -> None:
    prompts = ["The quick brown fox", "hybrid models: ", "x" * 70]
    texts: dict[str, list[str]] = {}
    for mode in ("on", "off"):
        # Two torch threads: the native step splits its rows over two (a pool of its own).
        args = ("--native-decode", mode, "--num-threads", "2")
        with start_runtime_server(model_dir, *args, log_dir=tmp_path / mode) as server:
            info = httpx.get(server.url + "/server_info", timeout=30).json()
            state = info["internal_states"][0]["native_decode"]
            assert state == ("on" if mode == "on" else "off: --native-decode off")
            texts[mode] = [_greedy_text(server.url, p, 24) for p in prompts]
            threads = httpx.get(server.url + "/server_info", timeout=30).json()["internal_states"][0]
            log = server.log_text()
            line = next(x for x in log.splitlines() if "Native decode:" in x)
            assert ("Native decode: on (" in line) == (mode == "on"), line
            if mode == "on":
                cores = min(2, len(os.sched_getaffinity(0)))  # --num-threads 2, at most the cores we may use
                assert f"threads {cores}; short extends)" in line, line
                assert threads["native_decode_threads"] == str(cores)
            else:
                assert threads["native_decode_threads"] == ""
    assert texts["on"] == texts["off"]
    assert all(len(t) > 0 for t in texts["on"])


def test_with_torch_compile_native_runs_the_decode_and_no_decode_graph_is_built(model_dir: Path) -> None:
    core = make_core(model_dir, enable_torch_compile=True, torch_compile_max_extend_tokens=0)
    assert core.runner.native_decode is not None and core.runner.compiled_decode is None
    assert core.stats().torch_compile == "none" and core.stats().native_decode == "on"
    want = run_to_completion(
        make_core(model_dir, native_decode="off"), [GenerateRequest("a", [9] * 12, greedy(6))], together=True
    )
    got = run_to_completion(core, [GenerateRequest("a", [9] * 12, greedy(6))], together=True)
    assert got.tokens("a") == want.tokens("a")
