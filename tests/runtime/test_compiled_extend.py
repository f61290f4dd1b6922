"""`--enable-torch-compile` compiles short one-sequence extends too (runtime/engine/compiled_extend.py): greedy
outputs equal the eager engine's token for token over random prompts (fresh short prompts, prefix-cache hits that
resume mid-document, branch points that split an extend at a state checkpoint, exact repeats), the prefix cache
keeps the states those forwards write, and nothing recompiles after start-up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest
from runtime.engine.compile_support import graphs_compiled
from runtime.engine.compiled_extend import extend_buckets
from runtime.engine.engine_core import EngineCore
from tests.runtime.test_engine_support import build_tiny_nemotron_h, greedy, one_torch_thread, run_to_completion

# The module's first test pays inductor's cold compile (its fixture), which takes minutes on a 2-core host and
# more under load: a wider limit than the suite's 600 s, so a slow host is not read as a hang.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MAX_EXTEND = 16  # buckets 8 and 16: two graphs keep the compile short
INTERVAL = 16  # state checkpoints every 16 tokens, so cache hits resume close to the branch point


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _core(model_dir: Path, **kw: object) -> EngineCore:
    kw.setdefault("native_decode", "off")  # the compiled forwards against torch eager (native_decode.py aside)
    return EngineCore(
        EngineArgs(model_path=str(model_dir), memory_budget_gib=0.2, mamba_track_interval=INTERVAL, **kw)  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def cores(demo_model_dir: Path) -> tuple[EngineCore, EngineCore]:
    compiled = _core(
        demo_model_dir, enable_torch_compile=True, torch_compile_max_bs=4, torch_compile_max_extend_tokens=MAX_EXTEND
    )
    return compiled, _core(demo_model_dir)


def _run(core: EngineCore, rid: str, prompt: list[int], new: int = 4) -> tuple[list[int], int]:
    got = run_to_completion(core, [GenerateRequest(rid=rid, input_ids=prompt, sampling=greedy(new))], together=False)
    return got.tokens(rid), got.final(rid).cached_tokens


def test_buckets() -> None:
    assert extend_buckets(64) == (8, 16, 32, 64)
    assert extend_buckets(5) == (8,)
    assert extend_buckets(100) == (8, 16, 32, 64, 128)


def test_warm_up_compiled_every_bucket(cores: tuple[EngineCore, EngineCore]) -> None:
    compiled, eager = cores
    ce = compiled.runner.compiled_extend
    assert ce is not None and eager.runner.compiled_extend is None
    assert ce.report.enabled, ce.report.reason
    assert ce.buckets == (8, 16) and ce.report.graphs == 2
    assert not ce.forwards_by_bucket  # warm-up's own forwards are not counted


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    doc=st.lists(st.integers(3, 2000), min_size=1, max_size=70),
    questions=st.lists(st.lists(st.integers(3, 2000), min_size=1, max_size=14), min_size=2, max_size=3),
    fresh=st.lists(st.integers(3, 2000), min_size=1, max_size=12),
)
def test_greedy_identical_to_eager(
    cores: tuple[EngineCore, EngineCore], doc: list[int], questions: list[list[int]], fresh: list[int]
) -> None:
    compiled, eager = cores
    for core in cores:
        assert core.scheduler.flush_cache()
    before = compiled.runner.compiled_extend.forwards_by_bucket.total() if compiled.runner.compiled_extend else 0
    prompts = [doc + q for q in questions] + [doc + questions[-1], fresh]
    for i, prompt in enumerate(prompts):
        assert _run(compiled, f"c{i}", prompt) == _run(eager, f"e{i}", prompt), f"prompt {i} of {prompts}"
    assert compiled.runner.compiled_extend is not None
    assert compiled.runner.compiled_extend.forwards_by_bucket.total() > before  # the fresh prompt at least


@pytest.mark.parametrize("traced", [True, False])
def test_branch_point_checkpoint_caches_the_right_state(cores: tuple[EngineCore, EngineCore], traced: bool) -> None:
    """A hit that resumes at the document's last checkpoint (32) and extends past the branch point (40): the
    compiled forward writes the state after 8 of its 12 tokens into the checkpoint slot (traced: inside the
    graph, as every shipped layer kind does; split: two forwards and a state copy, the fallback for a layer kind
    without traced checkpoints). A third
    prompt then resumes exactly at the branch point, from that state."""
    compiled, eager = cores
    ce = compiled.runner.compiled_extend
    assert ce is not None and ce.traced_checkpoints  # the demo model is a Qwen3-Next
    doc = list(range(100, 140))  # 40 tokens
    results = {}
    ce.traced_checkpoints = traced  # split: its graphs still write a checkpoint, into the padding slot
    try:
        for name, core in (("compiled", compiled), ("eager", eager)):
            assert core.scheduler.flush_cache()
            checkpoints = core.scheduler.counters.state_checkpoints
            parts = ce.forwards_by_bucket.total()
            # 14 tokens past the document: a's tail checkpoints (runtime/scheduler/checkpoints.py) lie beyond it.
            a = _run(core, f"{name}-{traced}-a", doc + [7, 8, 9] + [3 + j for j in range(14)])
            b = _run(core, f"{name}-{traced}-b", doc + [11, 12, 13, 14])  # resumes at 32: 8 + 4 new, branch at 8
            c = _run(core, f"{name}-{traced}-c", doc + [21, 22])  # resumes at 40: the state b's forward wrote
            results[name] = (a, b, c)
            assert (a[1], b[1], c[1]) == (0, 32, 40)
            assert core.scheduler.counters.state_checkpoints > checkpoints
            if core is compiled:
                assert ce.forwards_by_bucket.total() - parts == (2 if traced else 3)
    finally:
        ce.traced_checkpoints = True
    assert results["compiled"] == results["eager"]


def test_no_recompile_after_warm_up(cores: tuple[EngineCore, EngineCore]) -> None:
    compiled, eager = cores
    ce = compiled.runner.compiled_extend
    assert ce is not None
    ce.skip_guards = False  # every guard evaluated: an extend that needs another graph would compile one
    try:
        graphs = graphs_compiled()
        for n in (1, 5, 8, 9, 16):
            prompt = [50 + n + i for i in range(n)]
            assert _run(compiled, f"r{n}", prompt) == _run(eager, f"re{n}", prompt)
        assert graphs_compiled() == graphs, "an extend recompiled after warm-up"
    finally:
        ce.skip_guards = True


def test_long_extends_and_batches_stay_eager(cores: tuple[EngineCore, EngineCore]) -> None:
    compiled, _ = cores
    ce = compiled.runner.compiled_extend
    assert ce is not None
    before = ce.forwards_by_bucket.total()
    _run(compiled, "long", list(range(300, 300 + MAX_EXTEND + 1)))
    reqs = [GenerateRequest(rid=f"two{i}", input_ids=[9, i + 3, 4], sampling=greedy(2)) for i in range(2)]
    run_to_completion(compiled, reqs, together=True)  # one extend of two sequences
    assert ce.forwards_by_bucket.total() == before


def test_off_with_zero_max_tokens(demo_model_dir: Path) -> None:
    core = _core(demo_model_dir, enable_torch_compile=True, torch_compile_max_bs=4, torch_compile_max_extend_tokens=0)
    assert core.runner.compiled_decode is not None and core.runner.compiled_extend is None
    assert torch.get_num_threads() == 1


def test_mamba2_layers_write_the_checkpoint_in_the_graph(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Nemotron-H (Mamba2 layers, the SSD scan's traced checkpoints) compiled and eager agree on a document's
    hits, the branch-point resume and fresh prompts."""
    model_dir = build_tiny_nemotron_h(tmp_path_factory.mktemp("nemotron") / "model")
    compiled = _core(
        model_dir, enable_torch_compile=True, torch_compile_max_bs=2, torch_compile_max_extend_tokens=MAX_EXTEND
    )
    eager = _core(model_dir)
    ce = compiled.runner.compiled_extend
    assert ce is not None and ce.traced_checkpoints, ce and ce.report.reason
    doc = [(13 * j + 5) % 200 + 3 for j in range(40)]
    # The first runs 17 tokens past the document, so its tail checkpoints (checkpoints.py) lie beyond it.
    first = doc + [7, 8, 9] + [3 + j for j in range(14)]
    prompts = [first, doc + [11, 12, 13, 14], doc + [21, 22], [5, 6, 7], [9] * 14]
    runs = {}
    for name, core in (("compiled", compiled), ("eager", eager)):
        reqs = [
            GenerateRequest(rid=f"{name}{i}", input_ids=p, sampling=greedy(4), return_logprob=True)
            for i, p in enumerate(prompts)
        ]
        runs[name] = (run_to_completion(core, reqs, together=False), [r.rid for r in reqs])
    (got, c_ids), (want, e_ids) = runs["compiled"], runs["eager"]
    assert [got.tokens(r) for r in c_ids] == [want.tokens(r) for r in e_ids]
    assert [got.final(r).cached_tokens for r in c_ids] == [0, 32, 40, 0, 0]
    # Logprobs too: a wrong state at the branch point (the third prompt resumes from it) shows there before it
    # flips a greedy token of this tiny model.
    for c, e in zip(c_ids, e_ids, strict=True):
        lp_c = [x for o in got.outputs[c] for x in o.new_token_logprobs or []]
        lp_e = [x for o in want.outputs[e] for x in o.new_token_logprobs or []]
        assert lp_c == pytest.approx(lp_e, abs=1e-4), c
    assert ce.forwards_by_bucket.total() == 4  # the two hits and the two fresh prompts, one forward each
