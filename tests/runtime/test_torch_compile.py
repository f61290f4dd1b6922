"""`--enable-torch-compile`: greedy outputs of the compiled decode equal the eager engine's token for token
(prefix cache on, alone and in concurrent batches, batches above --torch-compile-max-bs falling back to eager),
with the graphs compiled for 1 and for 2 intra-op threads alike, and nothing recompiles after the engine's start-up
warm-up, whatever the batch size (1..max_bs), KV length or thread count."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest
from runtime.engine.compile_support import graphs_compiled as _graphs_compiled
from runtime.engine.compile_support import restored
from runtime.engine.compiled_decode import THREADS_ENV, CompiledDecode, _warmup_inputs
from runtime.engine.engine_core import EngineCore
from runtime.engine.pool_setup import canonical_slots
from runtime.models.layers.moe import Experts, swiglu, traced_experts
from runtime.models.layers.sigmoid_moe import Relu2Experts, relu2
from tests.runtime.test_engine_support import greedy, one_torch_thread, run_to_completion

# The module's first test pays inductor's cold compile (its fixture), which takes minutes on a 2-core host and
# more under load: a wider limit than the suite's 600 s, so a slow host is not read as a hang.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MAX_BS = 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _core(model_dir: Path, **kw: object) -> EngineCore:
    # The compiled decode against the torch eager one: the native decode (which wins the decode step where it
    # runs, runtime/engine/native_decode.py) off in both, unless a test asks for it.
    kw.setdefault("native_decode", "off")
    return EngineCore(EngineArgs(model_path=str(model_dir), memory_budget_gib=0.2, **kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cores(demo_model_dir: Path) -> tuple[EngineCore, EngineCore]:
    # One compiled engine per module: the compile is the expensive part (inductor's cache under /tmp makes
    # a rerun cheaper). Built under 2 torch threads, so it compiles graphs for 1 and for 2 threads.
    torch.set_num_threads(2)
    try:
        compiled = _core(
            demo_model_dir, enable_torch_compile=True, torch_compile_max_bs=MAX_BS, torch_compile_max_extend_tokens=16
        )
    finally:
        torch.set_num_threads(1)
    return compiled, _core(demo_model_dir)


@contextmanager
def _pinned(cd: CompiledDecode, threads: int | None) -> Iterator[None]:
    """Run the compiled decode on `threads` threads only (None: adaptive)."""
    before = cd.threads.pinned
    cd.threads.pinned = threads
    try:
        yield
    finally:
        cd.threads.pinned = before


def _requests(tag: str) -> list[GenerateRequest]:
    shared = [17, 305, 2048, 9, 77, 1200, 3, 64, 980, 4000, 12, 150]
    prompts = [
        shared + [5, 6, 7],
        shared + [5, 6, 8, 9, 10],
        shared[:5],
        [42],
        [1000 + i for i in range(40)],
        shared + [999] * 30,
    ]
    # Different lengths, so the batch shrinks as requests finish and sequences of unequal KV length decode
    # together (the padded, masked gather).
    return [
        GenerateRequest(rid=f"{tag}{i}", input_ids=p, sampling=greedy(max_new_tokens=6 + 5 * i))
        for i, p in enumerate(prompts)
    ]


def _tokens(core: EngineCore, tag: str, *, together: bool) -> dict[str, list[int]]:
    reqs = _requests(tag)
    got = run_to_completion(core, reqs, together=together)
    return {r.rid.removeprefix(tag): got.tokens(r.rid) for r in reqs}


def test_warm_up_compiled_two_graphs(cores: tuple[EngineCore, EngineCore]) -> None:
    compiled, eager = cores
    assert compiled.runner.compiled_decode is not None and eager.runner.compiled_decode is None
    report = compiled.runner.compiled_decode.report
    assert report.enabled, report.reason
    assert report.graphs == 4  # batch 1 and one dynamic graph for 2..max_bs, for 1 and for 2 threads
    assert report.elapsed_s > 0
    assert compiled.runner.compiled_decode.threads.describe() == "adaptive 1|2"


def test_thread_count_pinned_by_env(monkeypatch: pytest.MonkeyPatch, cores: tuple[EngineCore, EngineCore]) -> None:
    model = cores[1].model
    monkeypatch.setenv(THREADS_ENV, "2")
    assert CompiledDecode(model, MAX_BS).threads.describe() == "2 (pinned)"
    monkeypatch.setenv(THREADS_ENV, "two")
    with pytest.raises(ValueError, match=THREADS_ENV):
        CompiledDecode(model, MAX_BS)
    gc.collect()  # a second live CompiledDecode would make the engine's evaluate every guard again


@pytest.mark.parametrize("threads", [1, 2])
def test_greedy_identical_and_no_recompile(cores: tuple[EngineCore, EngineCore], threads: int) -> None:
    compiled, eager = cores
    cd = compiled.runner.compiled_decode
    assert cd is not None
    cd.skip_guards = False  # every guard evaluated: a step that needs another graph would compile one
    before = cd.steps_by_batch_size.copy()
    try:
        graphs = _graphs_compiled()
        with _pinned(cd, threads):
            for together in (False, True):
                tag = f"guarded-{threads}-{together}-"
                assert _tokens(compiled, tag, together=together) == _tokens(eager, tag, together=together)
        assert _graphs_compiled() == graphs, "a decode step recompiled after warm-up"
    finally:
        cd.skip_guards = True
    new = cd.steps_by_batch_size - before
    assert set(new) == set(range(1, MAX_BS + 1)), new  # all exercised


def test_greedy_identical_with_guards_skipped(cores: tuple[EngineCore, EngineCore]) -> None:
    compiled, eager = cores
    cd = compiled.runner.compiled_decode
    assert cd is not None and cd.skip_guards
    before = cd.steps_by_batch_size.total()
    # Adaptive: whichever thread count the chooser runs, the tokens are the eager engine's.
    for together in (True, False, True):  # the second batched round hits the prefix cache everywhere
        tag = f"skipped-{together}-{cd.steps_by_batch_size.total()}-"
        assert _tokens(compiled, tag, together=together) == _tokens(eager, tag, together=together)
    assert cd.steps_by_batch_size.total() > before
    assert cd.threads.in_use() and set(cd.threads.in_use().values()) <= {1, 2}
    assert compiled.scheduler.stats().cache_hit_rate > 0


def test_guard_skipped_steps_set_no_dynamic_marks(cores: tuple[EngineCore, EngineCore]) -> None:
    """After warm-up no call compiles (the guards are skipped: torch raises instead), so a step sets no
    dynamic-dim marks, Python work on every step's fresh inputs; with the guards evaluated it marks them for the
    compile a step may need. Both steps run the same graph: equal logits."""
    compiled, _ = cores
    cd = compiled.runner.compiled_decode
    assert cd is not None and cd.skip_guards
    buffers = compiled.pools.buffers
    vocab = compiled.model.layout().vocab_size
    with torch.inference_mode(), restored(buffers, 3 * 54, 3):
        skipped = _warmup_inputs(3, 41, vocab, cd.device)
        logits = cd._run(*skipped, buffers)
        assert not any(hasattr(t, "_dynamo_dynamic_indices") for t in skipped)
    with torch.inference_mode(), restored(buffers, 3 * 54, 3):
        cd.skip_guards = False
        try:
            guarded = _warmup_inputs(3, 41, vocab, cd.device)
            graphs = _graphs_compiled()
            again = cd._run(*guarded, buffers)
            assert _graphs_compiled() == graphs
        finally:
            cd.skip_guards = True
        assert all(hasattr(t, "_dynamo_dynamic_indices") for t in guarded)
    torch.testing.assert_close(again, logits, rtol=0, atol=0)


def test_extends_and_big_batches_stay_eager(cores: tuple[EngineCore, EngineCore]) -> None:
    compiled, _ = cores
    assert compiled.runner.compiled_decode is not None
    before = compiled.runner.compiled_decode.steps_by_batch_size.copy()
    reqs = [GenerateRequest(rid=f"big{i}", input_ids=[7, i + 1], sampling=greedy(max_new_tokens=3)) for i in range(6)]
    run_to_completion(compiled, reqs, together=True)
    new = compiled.runner.compiled_decode.steps_by_batch_size - before
    assert all(bs <= MAX_BS for bs in new), new  # 6 sequences decode together: eager


@settings(max_examples=20, deadline=None)
@given(
    tokens=st.integers(1, 9),
    num_experts=st.sampled_from([4, 8, 72]),  # 72: above the dense cut, gathered even for several tokens
    top_k=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_traced_experts_equal_the_eager_dispatch(tokens: int, num_experts: int, top_k: int, seed: int) -> None:
    """The host-sync-free expert paths the compiled graphs use compute what the eager dispatch computes, for
    the SwiGLU experts (Qwen3-Next, Kimi, Granite) and the relu² ones (Nemotron-H)."""
    gen = torch.Generator().manual_seed(seed)
    swiglu_experts = Experts(num_experts, 16, 12)
    relu2_experts = Relu2Experts(num_experts, 16, 12)
    with torch.no_grad():
        for p in (*swiglu_experts.parameters(), *relu2_experts.parameters()):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    x = torch.randn(tokens, 16, generator=gen)
    weights, ids = torch.topk(torch.softmax(torch.randn(tokens, num_experts, generator=gen), -1), top_k, dim=-1)
    with torch.inference_mode():
        torch.testing.assert_close(
            traced_experts(x, ids, weights, swiglu_experts.gate_up_proj, swiglu_experts.down_proj, swiglu),
            swiglu_experts.forward_sparse(x, ids, weights),
            rtol=1e-5,
            atol=1e-6,
        )
        torch.testing.assert_close(
            traced_experts(x, ids, weights, relu2_experts.up_proj, relu2_experts.down_proj, relu2),
            relu2_experts(x, ids, weights),
            rtol=1e-5,
            atol=1e-6,
        )


def test_compiled_engine_reports_the_planned_pools(cores: tuple[EngineCore, EngineCore]) -> None:
    compiled, eager = cores
    # Allocated at canonical sizes for the graphs (runtime/engine/pool_setup.py), reported as planned.
    assert compiled.pools.buffers.k[0].shape[0] == canonical_slots(compiled.pools.plan.max_total_num_tokens)
    c, e = compiled.stats(), eager.stats()
    assert (c.max_total_num_tokens, c.max_mamba_cache_size, c.max_running_requests) == (
        e.max_total_num_tokens,
        e.max_mamba_cache_size,
        e.max_running_requests,
    )
    assert (c.kv_cache_bytes, c.conv_state_bytes, c.ssm_state_bytes) == (
        e.kv_cache_bytes,
        e.conv_state_bytes,
        e.ssm_state_bytes,
    )
    assert (c.torch_compile, e.torch_compile) == ("decode+extend", "off")


def test_pools_of_another_size_reuse_the_cached_graphs(
    cores: tuple[EngineCore, EngineCore], demo_model_dir: Path
) -> None:
    """Another budget plans other pools but allocates the same canonical shapes: its engine's start-up compiles
    nothing cold (every graph from inductor's on-disk cache, which the fixture's engine filled)."""
    compiled, _ = cores
    misses, hits = counters["inductor"]["fxgraph_cache_miss"], counters["inductor"]["fxgraph_cache_hit"]
    torch.set_num_threads(2)  # as the fixture: graphs for 1 and 2 threads
    try:
        other = EngineCore(
            EngineArgs(
                model_path=str(demo_model_dir),
                memory_budget_gib=0.3,
                enable_torch_compile=True,
                torch_compile_max_bs=MAX_BS,
                torch_compile_max_extend_tokens=16,
                native_decode="off",
            )
        )
    finally:
        torch.set_num_threads(1)
    try:
        assert other.pools.plan.max_total_num_tokens != compiled.pools.plan.max_total_num_tokens
        assert other.pools.buffers.k[0].shape == compiled.pools.buffers.k[0].shape
        assert other.pools.buffers.conv[0].shape == compiled.pools.buffers.conv[0].shape
        assert other.runner.compiled_paths() == "decode+extend"
        assert counters["inductor"]["fxgraph_cache_miss"] == misses, "a graph compiled cold for another pool size"
        assert counters["inductor"]["fxgraph_cache_hit"] > hits
    finally:
        del other
        gc.collect()  # a second live CompiledDecode would make the fixture's evaluate every guard again


def test_elastic_pool_keeps_decode_eager_and_says_why(demo_model_dir: Path) -> None:
    core = _core(demo_model_dir, enable_torch_compile=True, enable_elastic_memory_pool=True)
    assert core.runner.compiled_decode is not None
    report = core.runner.compiled_decode.report
    assert not report.enabled and "--enable-elastic-memory-pool" in report.reason
    assert core.runner.compiled_extend is None  # the same reason keeps extends eager
    reqs = [GenerateRequest(rid="e", input_ids=[5, 6, 7], sampling=greedy(max_new_tokens=4))]
    # check=False: the fixed-split slot invariant does not describe the elastic pool's chunks.
    assert len(run_to_completion(core, reqs, together=True, check=False).tokens("e")) == 4
    assert not core.runner.compiled_decode.steps_by_batch_size
