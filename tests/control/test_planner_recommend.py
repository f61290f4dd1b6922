"""make_plan (config + flags -> pools), SGLang's static-memory rules, and recommend()."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hybridctl.config.schema import HybridConfig
from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridctl.planner.memory import (
    auto_mem_fraction_static,
    gpu_tier,
    pool_bytes_for,
    vlm_mem_fraction_factor,
)
from hybridctl.planner.plan import make_plan, recommend
from hybridshared.sizing.pool_sizing import GIB, PoolInputs, PoolSizingError, size_pools

TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "models"
QWEN3_NEXT = TEMPLATES / "qwen3-next-80b-a3b.json"
NEMOTRON = TEMPLATES / "nemotron-h-8b.json"


@pytest.mark.parametrize(
    ("gib", "tp", "expected"),
    [
        # arg_groups/memory_hook.py:279-325: reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024
        # + decode graph bs * 2 + 8 per captured prefill size (MiB), >= 10 GiB above 60 GiB;
        # fraction = round((gpu - reserved) / gpu, 3). Captured prefill sizes: 58 up to 8192, 50 up to 4096,
        # 42 up to 2048 (cuda_graph_hook.py:480-497, checked against SGLang in test_planner_sglang.py).
        (80, 1, round((81920 - (512 + 8192 * 1.5 + 128 + 256 * 2 + 58 * 8)) / 81920, 3)),  # 0.830
        (80, 8, round((81920 - (512 + 8192 * 1.5 + 1024 + 512 * 2 + 58 * 8)) / 81920, 3)),
        (24, 1, round((24576 - (512 + 4096 * 1.5 + 128 + 48 * 2 + 50 * 8)) / 24576, 3)),  # no 10 GiB floor
        (141, 1, round((144384 - (512 + 8192 * 1.5 + 128 + 256 * 2 + 58 * 8)) / 144384, 3)),
        (16, 1, round((16384 - (512 + 2048 * 1.5 + 128 + 8 * 2 + 42 * 8)) / 16384, 3)),
    ],
)
def test_auto_mem_fraction_static(gib: int, tp: int, expected: float) -> None:
    assert auto_mem_fraction_static(gib * GIB, tp=tp) == expected


def test_prefill_graph_is_off_for_kda_and_flat_for_mla() -> None:
    without = round((81920 - (512 + 8192 * 1.5 + 128 + 256 * 2)) / 81920, 3)
    assert auto_mem_fraction_static(80 * GIB, tp=1, prefill_graph=False) == without
    mla = round((81920 - (512 + 8192 * 1.5 + 128 + 256 * 2 + 1536)) / 81920, 3)
    assert auto_mem_fraction_static(80 * GIB, tp=1, mla=True) == mla
    kimi = recommend(
        load_model_shape_or_bundled(TEMPLATES / "kimi-linear-48b-a3b.json", tp=2), gpu_mem_bytes=80 * GIB, tp=2
    )
    assert kimi.values["mem_fraction_static"] == auto_mem_fraction_static(80 * GIB, tp=2, prefill_graph=False)


def test_gpu_tiers() -> None:
    assert gpu_tier(80 * GIB, 1).chunked_prefill_size == 8192
    assert gpu_tier(192 * GIB, 1).chunked_prefill_size == 16384
    assert gpu_tier(None, 1).decode_graph_max_bs == 160


def test_pool_bytes_and_weights_that_do_not_fit() -> None:
    assert pool_bytes_for(80 * GIB, mem_fraction_static=0.85, weights_bytes_per_rank=40 * GIB) == int(
        80 * GIB * 0.85 - 40 * GIB
    )
    with pytest.raises(PoolSizingError, match=r"Raise memory.mem_fraction_static above 0.625"):
        pool_bytes_for(80 * GIB, mem_fraction_static=0.6, weights_bytes_per_rank=50 * GIB)
    with pytest.raises(PoolSizingError, match=r"Shard the model over about 4x more GPUs"):
        pool_bytes_for(80 * GIB, mem_fraction_static=0.85, weights_bytes_per_rank=160 * GIB)


def test_make_plan_is_size_pools_with_the_resolved_inputs() -> None:
    spec = load_model_shape_or_bundled(QWEN3_NEXT, tp=4)
    plan = make_plan(HybridConfig(), spec, gpu_mem_bytes=80 * GIB)
    assert (plan.strategy, plan.overlap_schedule, plan.pool_source) == ("extra_buffer", True, "derived")
    assert plan.pool_bytes == int(80 * GIB * 0.85 - spec.weights_bytes_per_rank)
    direct = size_pools(
        PoolInputs(
            pool_bytes=plan.pool_bytes,
            mamba_state_bytes_per_request=spec.mamba_state_bytes_per_request,
            kv_bytes_per_token=spec.kv_bytes_per_token,
            strategy="extra_buffer",
            overlap_schedule=True,
            context_len=spec.context_len,
        )
    )
    assert plan.pools == direct
    d = plan.to_dict()
    for key in (
        "mamba_state_bytes_per_request",
        "kv_bytes_per_token",
        "weights_bytes",
        "pool_bytes",
        "max_mamba_cache_size",
        "max_total_num_tokens",
        "max_running_requests",
        "spec_intermediate_bytes",
    ):
        assert key in d
    assert f"{direct.max_running_requests} concurrent requests" in d["verdict"]


def test_make_plan_reads_the_config_and_flags_win() -> None:
    spec = load_model_shape_or_bundled(NEMOTRON)
    cfg = HybridConfig()
    cfg.config.memory.mamba_full_memory_ratio = 2.0
    cfg.config.speculative.speculative_algorithm = "NEXTN"
    cfg.config.speculative.speculative_num_draft_tokens = 4
    base = make_plan(HybridConfig(), spec, pool_bytes=30 * GIB)
    configured = make_plan(cfg, spec, pool_bytes=30 * GIB)
    assert configured.pools.spec_intermediate_bytes > 0 and configured.speculative_num_draft_tokens == 4
    assert configured.mamba_full_memory_ratio == 2.0
    flagged = make_plan(cfg, spec, pool_bytes=30 * GIB, speculative_num_draft_tokens=0, mamba_full_memory_ratio=0.9)
    assert flagged.pools == base.pools
    cfg.settings.runtime.disable_radix_cache = True
    assert make_plan(cfg, spec, pool_bytes=30 * GIB).pools.slots_per_request == 1
    with pytest.raises(ValueError, match="gpu_mem_bytes"):
        make_plan(cfg, spec)


def test_recommend_hits_the_concurrency_target_and_init_can_apply_it() -> None:
    spec = load_model_shape_or_bundled(NEMOTRON)
    rec = recommend(spec, gpu_mem_bytes=80 * GIB, tp=1, context_len=8192, concurrency=64)
    assert rec.values["max_running_requests"] == 64
    assert rec.pools.max_running_requests >= 64
    assert set(rec.values) == set(rec.reasons)
    assert all(rec.reasons.values())
    # The values, written into the config, plan back to the same pools.
    cfg = HybridConfig()
    cfg.config.memory.mem_fraction_static = rec.values["mem_fraction_static"]
    cfg.config.memory.mamba_full_memory_ratio = rec.values["mamba_full_memory_ratio"]
    cfg.config.cache.mamba_radix_cache_strategy = rec.values["mamba_radix_cache_strategy"]
    plan = make_plan(cfg, spec, gpu_mem_bytes=80 * GIB)
    assert plan.pools == rec.pools
    # A smaller target needs a smaller share of the pool for state.
    small = recommend(spec, gpu_mem_bytes=80 * GIB, tp=1, context_len=8192, concurrency=8)
    assert small.values["mamba_full_memory_ratio"] < rec.values["mamba_full_memory_ratio"]


def test_recommend_without_target_keeps_sglang_default_ratio() -> None:
    rec = recommend(load_model_shape_or_bundled(NEMOTRON), gpu_mem_bytes=80 * GIB, tp=1)
    assert rec.values["mamba_full_memory_ratio"] == 0.9
    assert rec.values["max_running_requests"] == rec.pools.max_running_requests


def test_recommend_says_when_the_target_cannot_fit() -> None:
    rec = recommend(
        load_model_shape_or_bundled(NEMOTRON), gpu_mem_bytes=24 * GIB, tp=1, context_len=8192, concurrency=5000
    )
    assert rec.values["max_running_requests"] < 5000
    assert "do not fit" in rec.reasons["mamba_full_memory_ratio"]
    assert "bfloat16" in rec.reasons["mamba_full_memory_ratio"]


def test_recommend_errors() -> None:
    spec = load_model_shape_or_bundled(QWEN3_NEXT)
    with pytest.raises(PoolSizingError, match="Shard the model"):
        recommend(spec, gpu_mem_bytes=80 * GIB, tp=1, context_len=8192, concurrency=16)
    with pytest.raises(ValueError, match="loaded for tp=1"):
        recommend(spec, gpu_mem_bytes=80 * GIB, tp=4, context_len=8192, concurrency=16)


def test_recommend_for_the_bundled_runtime() -> None:
    """The runtime checkpoints with extra_buffer and has no overlap schedule: 4 slots per request."""
    spec = load_model_shape_or_bundled(NEMOTRON)
    rec = recommend(spec, gpu_mem_bytes=64 * GIB, tp=1, context_len=4096, concurrency=4, engine="builtin")
    assert rec.values["mamba_radix_cache_strategy"] == "extra_buffer"
    assert rec.values["mem_fraction_static"] == 0.85
    assert rec.pools.slots_per_request == 4 and rec.values["max_running_requests"] == 4


def test_vision_encoder_lowers_the_fraction() -> None:
    """memory_hook.py:432-462: Qwen3.5's ViT (num_hidden_layers unset -> 24, hidden 1152): x 0.9248."""
    spec = load_model_shape_or_bundled(TEMPLATES / "qwen3.5-35b-a3b.json")
    assert (spec.vit_num_layers, spec.vit_hidden_size) == (24, 1152)
    factor = 0.95 * (1 - 0.1 * (24 * 1152**2 / (24 * 1024**2) - 1))
    assert vlm_mem_fraction_factor(24, 1152) == pytest.approx(factor)
    rec = recommend(spec, gpu_mem_bytes=141 * GIB, tp=1)
    text_only = auto_mem_fraction_static(141 * GIB, tp=1)
    assert rec.values["mem_fraction_static"] == math.floor(text_only * factor * 1000) / 1000
    assert "vision encoder" in rec.reasons["mem_fraction_static"]
    assert load_model_shape_or_bundled(NEMOTRON).vit_num_layers is None
