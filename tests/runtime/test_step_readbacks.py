"""The accelerator path's step reads the device back at most once (the sampled tokens), for every family, at batch 1
and 8, decode and extend, model-level and through the engine; and it computes what the CPU path computes.

Readbacks are counted by runtime/core/readbacks.py, on the CPU by emulation: the model's weights and pools are
"device" tensors, and so is everything computed from them; `.item()`/`int()`/`bool()`, `.tolist()`, `.numpy()`,
`.cpu()`, copies into host tensors, and value-sized ops (`nonzero`, boolean indexing, `bincount`, ...) on them
count. The CPU path (host-driven MoE dispatch) is counted too, to show the counter sees real readbacks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.core.device_path import rehearse_accelerator_path
from runtime.core.readbacks import ReadbackCount, count_readbacks, model_device_tensors
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.models import load_model
from runtime.models.base import HybridModel
from runtime.scheduler.sampling import greedy_tokens, sample
from tests.runtime.simple_runner import SimpleRunner
from tests.runtime.test_engine_support import greedy, make_core, one_torch_thread, perturb_weights

transformers = pytest.importorskip("transformers")
from tests.runtime.test_model_reference import ARCHS, VOCAB  # noqa: E402 - needs transformers

REPO = Path(__file__).resolve().parents[2]
MOE_FAMILIES = ("granitemoehybrid", "kimi_linear", "nemotron_h", "qwen3_5_moe", "qwen3_next")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module", params=sorted(ARCHS))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, HybridModel]:
    torch.manual_seed(0)
    build = ARCHS[request.param][0]
    hf: Any = build()  # a transformers model (save_pretrained)
    hf.eval()
    perturb_weights(hf, 1)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, load_model(path)


def _prompts(batch: int, seed: int) -> dict[int, list[int]]:
    """Ragged lengths (3, 5, 7, ...): a non-uniform packed batch."""
    g = torch.Generator().manual_seed(seed)
    return {s: torch.randint(0, VOCAB, (3 + 2 * s,), generator=g).tolist() for s in range(batch)}


def _steps(model: HybridModel, batch: int) -> tuple[ReadbackCount, ReadbackCount, list[int], list[int]]:
    """A prefix, then one counted extend and one counted decode step, each with its sampling."""
    runner = SimpleRunner(model, num_state_slots=batch + 1)
    for s in range(batch):
        runner.add(s)
    runner.extend({s: p[:2] for s, p in _prompts(batch, 1).items()})  # the counted extend continues a prefix
    device = model_device_tensors(model, runner.buffers)
    with count_readbacks(device) as extend:
        first = greedy_tokens(runner.extend(_prompts(batch, 2)).float())
    with count_readbacks(device) as decode:
        second = greedy_tokens(runner.extend({s: [first[s]] for s in range(batch)}).float())
    return extend, decode, first, second


@pytest.mark.parametrize("batch", [1, 8])
def test_accelerator_step_reads_back_once(family: tuple[str, HybridModel], batch: int) -> None:
    with rehearse_accelerator_path():
        extend, decode, _, _ = _steps(family[1], batch)
    assert (extend.total, decode.total) == (1, 1), (extend.by_kind, decode.by_kind)
    assert extend.by_kind["numpy"] == decode.by_kind["numpy"] == 1  # the sampled tokens
    assert extend.uploads > 0 and decode.uploads > 0  # the counter saw the step's inputs go to the "device"


def test_the_cpu_path_reads_the_routing_back(family: tuple[str, HybridModel]) -> None:
    """The same count on the CPU path (routing read on the host; free there): the counter sees those reads."""
    name, model = family
    _, decode, _, _ = _steps(model, 1)
    assert decode.total > 1 if name in MOE_FAMILIES else decode.total == 1, decode.by_kind


@pytest.mark.parametrize("batch", [1, 8])
def test_accelerator_path_computes_what_the_cpu_path_does(family: tuple[str, HybridModel], batch: int) -> None:
    cpu = _steps(family[1], batch)
    with rehearse_accelerator_path():
        rehearsed = _steps(family[1], batch)
    assert (rehearsed[2], rehearsed[3]) == (cpu[2], cpu[3])


def test_seeded_sampling_reads_back_once() -> None:
    logits = torch.randn(8, VOCAB)
    device = [logits]
    params = [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.01)] * 7 + [SamplingParams(temperature=0)]
    with count_readbacks(device) as counted:
        tokens = sample(logits, params, [torch.Generator().manual_seed(i) for i in range(8)])
    assert counted.total == 1, counted.by_kind
    again = sample(logits, params, [torch.Generator().manual_seed(i) for i in range(8)])
    assert tokens == again and tokens[7] == int(logits[7].argmax())


def test_counter_counts_reads_of_device_values_only() -> None:
    dev, host = torch.arange(6.0), torch.arange(6.0)
    with count_readbacks([dev]) as counted:
        y = dev * 2
        host.tolist()
        int(host[1])
        bool(y.sum() > 0)  # _local_scalar_dense
        y.tolist()
        y[y > 2].sum()  # boolean index: sized by the values
        host.copy_(y)  # into host memory
        moved = host.to(torch.device("cpu"))  # an upload: a new "device" tensor
        moved.numpy()
    assert counted.by_kind == {"_local_scalar_dense": 1, "tolist": 1, "bool_index": 1, "copy_to_host": 1, "numpy": 1}
    assert counted.uploads == 1 and moved is not host


@pytest.mark.parametrize("batch", [1, 8])
def test_engine_step_reads_back_once(tmp_path: Path, batch: int) -> None:
    """Through the engine (scheduler, runner, sampling, emit): each decode step's and each extend step's counted
    region, one `core.step()`, reads back once."""
    from tests.runtime.test_engine_support import build_tiny_qwen3_next

    core = make_core(build_tiny_qwen3_next(tmp_path / "model"), native_decode="off")
    device = model_device_tensors(core.model, core.pools.buffers)
    for i, p in _prompts(batch, 3).items():
        core.scheduler.add_request(GenerateRequest(f"r{i}", p, greedy(3)), lambda _out: None)
    counts = []
    with rehearse_accelerator_path():
        while core.scheduler.has_work:
            with count_readbacks(device) as counted:
                core.step()
            counts.append(counted.total)
    assert len(counts) >= 3 and all(c <= 1 for c in counts), counts
    # No step went through the CPU thread choosers (on a GPU a step's wall time is the launch, not the work).
    choosers = [*core.runner.small_forward_threads.values(), core.runner.prefill_threads]
    assert all(c.last_used is None and not c.in_use() for c in choosers)


def test_a_model_on_the_accelerator_path_never_builds_the_c_kernels(tmp_path: Path) -> None:
    """The short-extend C kernels read host memory: loading a model for an accelerator neither compiles nor loads
    them (a fresh process: the kernels are process-wide)."""
    from tests.runtime.test_engine_support import build_tiny_qwen3_next

    model_dir = build_tiny_qwen3_next(tmp_path / "model")
    code = (
        "import sys; from runtime.core.device_path import rehearse_accelerator_path; "
        "from runtime.models import load_model; from runtime.native import extend_kernels\n"
        "with rehearse_accelerator_path():\n"
        f"    load_model({str(model_dir)!r})\n"
        "print(extend_kernels.built())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
