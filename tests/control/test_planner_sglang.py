"""`size_pools` against SGLang 0.5.23's own pool-sizing code, run from its source.

The methods that size a hybrid model's pools — `KVCacheConfigurator._handle_max_mamba_cache`, `_calculate_mamba_ratio`,
`resolve_max_num_reqs` (mem_cache/kv_cache_configurator.py), `get_mamba_tracking_slots`
(mem_cache/allocation_sizing.py), `MemoryPoolConfig` and `DefaultPoolConfigurator.calculate_pool_sizes`
(model_executor/pool_configurator.py) — are lifted out of the real files with `ast` and called with plain stand-ins for
SGLang's runtime context (the server arguments they read). Hypothesis then drives both implementations with the same
inputs. Skipped only when the source is absent.
"""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_source import SKIP_REASON, SRT, TEMPLATES, exec_lifted, lift

from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridctl.planner.memory import prefill_graph_sizes, vlm_mem_fraction_factor
from hybridshared.sizing.pool_sizing import GIB, PoolInputs, PoolSizingError, size_pools

KVC = SRT / "mem_cache" / "kv_cache_configurator.py"
POOLS = SRT / "model_executor" / "pool_configurator.py"
SIZING = SRT / "mem_cache" / "allocation_sizing.py"

pytestmark = pytest.mark.skipif(not KVC.is_file(), reason=SKIP_REASON)


class Reference:
    """SGLang's sizing path for one data-parallel worker, pipeline parallel 1, no replay/PD/unified memory."""

    def __init__(self) -> None:
        mod = types.ModuleType("_sglang_ref_pool_sizing")
        sys.modules[mod.__name__] = mod  # dataclasses resolves the module through sys.modules
        ns = mod.__dict__
        ns.update(dataclass=dataclass, Optional=Optional, logging=logging, logger=logging.getLogger("sglang-ref"))
        ratio_consts = {
            "MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO",
            "MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP",
            "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER",
        }
        exec_lifted(lift(KVC, ratio_consts), KVC, ns)
        exec_lifted(lift(SIZING, {"get_mamba_tracking_slots"}), SIZING, ns)
        exec_lifted(lift(POOLS, {"MemoryPoolConfig"}), POOLS, ns)
        methods = {"_calculate_mamba_ratio", "resolve_max_num_reqs", "_handle_max_mamba_cache"}
        exec_lifted(lift(KVC, methods, "KVCacheConfigurator"), KVC, ns)
        exec_lifted(lift(POOLS, {"calculate_pool_sizes"}, "DefaultPoolConfigurator"), POOLS, ns)
        self.ns = ns

    def size(self, inp: PoolInputs) -> tuple[int, int, int]:
        """(max_mamba_cache_size, max_total_num_tokens, max_running_requests) as SGLang computes them."""
        ns = self.ns
        draft = inp.speculative_num_draft_tokens
        extra = not inp.disable_radix_cache and inp.strategy in ("extra_buffer", "extra_buffer_lazy")
        running = inp.max_running_requests
        if draft and running is None:
            running = 48  # arg_groups/speculative_hook.py:1086-1090
        schedule = types.SimpleNamespace(
            max_mamba_cache_size=inp.max_mamba_cache_size,
            max_running_requests=running,
            mamba_full_memory_ratio=inp.mamba_full_memory_ratio,
            disable_overlap_schedule=not inp.overlap_schedule,
            page_size=inp.page_size,
            max_total_tokens=inp.max_total_tokens,
        )
        mamba = types.SimpleNamespace(
            enable_linear_replayssm_spec=False,
            enable_mamba_extra_buffer=extra,
            enable_mamba_extra_buffer_lazy=extra and inp.strategy == "extra_buffer_lazy",
        )

        def override(_source: str, **values: Any) -> None:
            for key, value in values.items():
                setattr(schedule, key, value)

        ns.update(
            get_schedule=lambda: schedule,
            get_memory=lambda: types.SimpleNamespace(disable_radix_cache=inp.disable_radix_cache),
            get_exec=lambda: types.SimpleNamespace(mamba=mamba),
            get_spec=lambda: types.SimpleNamespace(speculative_num_draft_tokens=draft or None),
            get_context=lambda: types.SimpleNamespace(override=override),
            envs=types.SimpleNamespace(SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=types.SimpleNamespace(get=lambda: False)),
            _pd_prefill_skips_mamba_spec_state=lambda: False,
        )
        params = types.SimpleNamespace(layers=[0], mamba_cache_per_req=inp.mamba_state_bytes_per_request)
        kvc = types.SimpleNamespace(
            mambaish_config=types.SimpleNamespace(mamba2_cache_params=params),
            pp_size=1,
            attn_dp_size=1,
            fused_entry_bytes=lambda _name: None,
            spec_algorithm=types.SimpleNamespace(is_none=lambda: draft == 0),
            hybrid_gdn_config=object(),
            hybrid_kda_config=None,
            extra_mamba_cache_bytes_per_req=0,
            model_config=types.SimpleNamespace(context_len=inp.context_len),
        )
        kvc._calculate_mamba_ratio = lambda: ns["_calculate_mamba_ratio"](kvc)
        rest = ns["_handle_max_mamba_cache"](kvc, inp.pool_bytes / GIB)
        if rest <= 0:  # kv_cache_configurator.py:3043-3058 (_profile_available_bytes)
            raise ValueError("Loaded weights leave no GPU memory for the KV cache")
        default = types.SimpleNamespace(
            _fixed_overhead_bytes=0,
            _cell_size=inp.kv_bytes_per_token,
            _zero_kv_max_tokens=inp.max_total_tokens or inp.context_len,  # pool_configurator.py:246-250
        )
        config = ns["calculate_pool_sizes"](default, int(rest * (1 << 30)), inp.page_size)
        tokens = config.max_total_num_tokens
        if inp.max_total_tokens is not None:  # kv_cache_configurator.py:3090-3117 then re-aligned
            tokens = min(tokens, inp.max_total_tokens) // inp.page_size * inp.page_size
            ns["MemoryPoolConfig"](max_total_num_tokens=tokens)
        return schedule.max_mamba_cache_size, tokens, ns["resolve_max_num_reqs"](kvc, tokens)


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference()


def _ours(inp: PoolInputs) -> tuple[int, int, int] | None:
    try:
        plan = size_pools(inp)
    except PoolSizingError:
        return None
    return plan.max_mamba_cache_size, plan.max_total_num_tokens, plan.max_running_requests


def _theirs(ref: Reference, inp: PoolInputs) -> tuple[int, int, int] | None:
    try:
        return ref.size(inp)
    except (RuntimeError, ValueError):
        return None


MODES = [("no_buffer", False), ("extra_buffer", True), ("extra_buffer", False), ("extra_buffer_lazy", True)]


@st.composite
def pool_inputs(draw: st.DrawFn) -> PoolInputs:
    strategy, overlap = draw(st.sampled_from(MODES))
    return PoolInputs(
        pool_bytes=draw(st.integers(64 << 20, 200 * GIB)),
        mamba_state_bytes_per_request=draw(st.integers(1 << 16, 300 << 20)),
        kv_bytes_per_token=draw(st.one_of(st.just(0), st.integers(512, 300_000))),
        page_size=draw(st.sampled_from([1, 16, 64])),
        mamba_full_memory_ratio=draw(st.floats(0.05, 5.0, allow_nan=False)),
        max_mamba_cache_size=draw(st.one_of(st.none(), st.integers(1, 4096))),
        max_running_requests=draw(st.one_of(st.none(), st.integers(1, 1024))),
        disable_radix_cache=draw(st.booleans()),
        strategy=strategy,
        overlap_schedule=overlap,
        speculative_num_draft_tokens=draw(st.sampled_from([0, 0, 2, 4, 8])),
        context_len=draw(st.sampled_from([4096, 32768, 262144])),
        max_total_tokens=draw(st.one_of(st.none(), st.integers(1, 4_000_000))),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(inp=pool_inputs())
def test_size_pools_matches_sglang(reference: Reference, inp: PoolInputs) -> None:
    assert _ours(inp) == _theirs(reference, inp)


def _qwen3_next(tp: int, pool_bytes: int, **kw: Any) -> PoolInputs:
    spec = load_model_shape_or_bundled(TEMPLATES / "qwen3-next-80b-a3b.json", tp=tp, ssm_dtype="float32")
    return PoolInputs(
        pool_bytes=pool_bytes,
        mamba_state_bytes_per_request=spec.mamba_state_bytes_per_request,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        context_len=spec.context_len,
        **kw,
    )


# Qwen3-Next-80B-A3B, fp32 SSM state, fixed `--pool-bytes`: (tp, pool, strategy...) -> (K, cap, KV tokens).
# Reproduce with: hybridctl plan --model templates/models/qwen3-next-80b-a3b.json --tp TP --pool-bytes N ...
DONE_WHEN = [
    (1, 40 * GIB, {"strategy": "extra_buffer", "overlap_schedule": True}, (262, 52, 920754)),
    (1, 40 * GIB, {"strategy": "no_buffer", "overlap_schedule": False}, (262, 87, 920754)),
    (4, 30 * GIB, {"strategy": "extra_buffer", "overlap_schedule": True}, (788, 157, 1381132)),
    (
        4,
        30 * GIB,
        {"strategy": "extra_buffer", "overlap_schedule": True, "speculative_num_draft_tokens": 4},
        (436, 48, 1626364),
    ),
]


@pytest.mark.parametrize(("tp", "pool", "kw", "expected"), DONE_WHEN)
def test_qwen3_next_pool_numbers(
    reference: Reference, tp: int, pool: int, kw: dict[str, Any], expected: tuple[int, int, int]
) -> None:
    inp = _qwen3_next(tp, pool, **kw)
    k, cap, tokens = expected
    assert reference.size(inp) == (k, tokens, cap)  # SGLang's code says so ...
    plan = size_pools(inp)  # ... and so do we
    assert (plan.max_mamba_cache_size, plan.max_running_requests, plan.max_total_num_tokens) == expected


def test_prefill_graph_sizes_match_sglang() -> None:
    hook = SRT / "arg_groups" / "cuda_graph_hook.py"
    ns: dict[str, Any] = {}
    exec_lifted(lift(hook, {"generate_prefill_cuda_graph_batch_sizes"}), hook, ns)
    for max_bs in (1, 4, 100, 2048, 4096, 8192, 16384, 20000):
        assert prefill_graph_sizes(max_bs) == ns["generate_prefill_cuda_graph_batch_sizes"](max_bs)


@pytest.mark.parametrize(("layers", "hidden"), [(24, 1152), (27, 1152), (32, 1280), (12, 768), (48, 4096)])
def test_vlm_fraction_factor_matches_sglang(layers: int, hidden: int) -> None:
    hook = SRT / "arg_groups" / "memory_hook.py"
    ns: dict[str, Any] = {}
    exec_lifted(lift(hook, {"adjust_mem_fraction_for_vlm"}), hook, ns)
    vision = types.SimpleNamespace(num_hidden_layers=layers, hidden_size=hidden)
    model_config = types.SimpleNamespace(hf_config=types.SimpleNamespace(vision_config=vision))
    theirs = ns["adjust_mem_fraction_for_vlm"](0.9, model_config, False, 80 * 1024)
    assert 0.9 * vlm_mem_fraction_factor(layers, hidden) == pytest.approx(theirs, rel=1e-12)
