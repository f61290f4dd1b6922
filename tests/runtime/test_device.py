"""The runtime on the device it runs on: CUDA when present, CPU always.

Sampling: `torch.multinomial` draws only with a generator on the probabilities' own device, so the scheduler
makes its generators there; before, every sampled (temperature > 0) request on CUDA failed its whole batch.
Sizing: on CUDA the pools come from the memory free before the weights loaded, capped at --memory-budget-gib
(before: the device's total memory, ~120 GB of pools for a 10M model on an H200)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybridshared.sizing.runtime_pools import DEFAULT_MEMORY_BUDGET_GIB, runtime_device_bytes
from hybridshared.units import GIB
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.scheduler.sampling import sample
from tests.runtime.test_engine_support import build_tiny_qwen3_next, make_core, one_torch_thread, run_to_completion

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with one_torch_thread():
        yield build_tiny_qwen3_next(Path(tmp_path_factory.mktemp("sampling_device")) / "model")


@pytest.mark.parametrize("device", DEVICES)
def test_sample_draws_with_a_generator_of_either_device(device: str) -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)).to(device)
    params = [SamplingParams(temperature=0.9, top_p=0.9, top_k=20)] * 3
    for gen_device in ("cpu", device):
        a = sample(logits, params, [torch.Generator(device=gen_device).manual_seed(5) for _ in range(3)])
        b = sample(logits, params, [torch.Generator(device=gen_device).manual_seed(5) for _ in range(3)])
        assert a == b  # a seeded draw repeats
        assert all(0 <= t < 50 for t in a)


@pytest.mark.parametrize("device", DEVICES)
def test_engine_samples_on_its_device(model_dir: Path, device: str) -> None:
    def run() -> dict[str, list[int]]:
        core = make_core(model_dir, device=device)
        seeded = SamplingParams(temperature=0.8, max_new_tokens=8, ignore_eos=True, seed=1234)
        shared = SamplingParams(temperature=0.8, max_new_tokens=8, ignore_eos=True)
        reqs = [GenerateRequest("seeded", [3, 4, 5, 6], seeded), GenerateRequest("shared", [7, 8, 9], shared)]
        got = run_to_completion(core, reqs, together=True)
        for rid in ("seeded", "shared"):
            assert got.final(rid).finish_reason == {"type": "length", "length": 8}, got.final(rid).finish_reason
        return {rid: got.tokens(rid) for rid in ("seeded", "shared")}

    with one_torch_thread():
        first, second = run(), run()
    assert len(first["seeded"]) == len(first["shared"]) == 8
    assert first == second  # the engine's seed and the request's seed both make a run repeat


def test_runtime_device_bytes_caps_the_gpu_at_the_budget() -> None:
    assert runtime_device_bytes(None, None) == int(DEFAULT_MEMORY_BUDGET_GIB * GIB)  # CPU default
    assert runtime_device_bytes(2.0, None) == 2 * GIB
    assert runtime_device_bytes(None, 80 * GIB) == 80 * GIB  # GPU: free memory, SGLang's default
    assert runtime_device_bytes(2.0, 80 * GIB) == 2 * GIB  # the budget caps it
    assert runtime_device_bytes(200.0, 80 * GIB) == 80 * GIB  # never more than is free


@pytest.mark.parametrize("device", DEVICES)
def test_pools_fit_the_memory_budget(model_dir: Path, device: str) -> None:
    budget_gib, fraction = 0.05, 0.85
    with one_torch_thread():
        core = make_core(model_dir, device=device, max_total_tokens=None, max_mamba_cache_size=None)
        s = core.stats()
    pools = s.kv_cache_bytes + s.conv_state_bytes + s.ssm_state_bytes
    assert pools > 0
    assert pools + s.weight_bytes <= budget_gib * fraction * GIB
