"""`size_pools` for older SGLang releases against each release's own sizing code, lifted from its wheel.

0.5.6 sizes pools in `ModelRunner.handle_max_mamba_cache` / `init_memory_pool` (model_executor/model_runner.py);
0.5.10 in `ModelRunnerKVCacheMixin` (model_executor/model_runner_kv_cache_mixin.py). The methods are lifted with
`ast` and called with plain stand-ins for the server arguments they read, as test_planner_sglang.py does for 0.5.23.
The last line of each `profile_max_num_token` (rest of the budget -> KV tokens) is written out here: the rest of
that method measures the GPU. 0.5.6 with speculative decoding also re-sizes the KV pool for draft headroom, which
hybridctl does not model, so its cases run without it.
"""

from __future__ import annotations

import logging
import types
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_releases import release_srt
from sglang_source import TEMPLATES, exec_lifted, lift

from hybridctl.config.schema import HybridConfig
from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridctl.planner.plan import make_plan
from hybridshared.sizing.pool_sizing import GIB, PoolInputs, PoolSizingError, size_pools
from hybridshared.sizing.release_sizing import release_sizing


class _Stop(Exception):
    """Raised where the lifted code goes on to allocate tensors: the sizes are final by then."""


class Release056:
    def __init__(self) -> None:
        path = release_srt("0.5.6") / "model_executor" / "model_runner.py"
        ns: dict[str, Any] = {"logging": logging, "logger": logging.getLogger("sglang-0.5.6"), "Optional": Optional}
        exec_lifted(lift(path, {"MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO"}), path, ns)
        exec_lifted(lift(path, {"handle_max_mamba_cache", "init_memory_pool"}, "ModelRunner"), path, ns)
        ns.update(SGLANG_CI_SMALL_KV_SIZE=None, log_info_on_rank0=lambda *a, **k: None)
        self.ns = ns

    def size(self, inp: PoolInputs) -> tuple[int, int, int]:
        """(max_mamba_cache_size, max_total_num_tokens, max_running_requests) as 0.5.6 computes them."""
        ns = self.ns
        args = types.SimpleNamespace(
            speculative_num_draft_tokens=inp.speculative_num_draft_tokens or None,
            disable_radix_cache=inp.disable_radix_cache, max_mamba_cache_size=inp.max_mamba_cache_size,
            max_running_requests=inp.max_running_requests, mamba_full_memory_ratio=inp.mamba_full_memory_ratio,
            kv_cache_dtype="auto", page_size=inp.page_size, enable_dp_attention=False, dp_size=1,
            disaggregation_mode="null", mem_fraction_static=0.9, enable_memory_saver=False,
        )  # fmt: skip
        params = types.SimpleNamespace(mamba_cache_per_req=inp.mamba_state_bytes_per_request)
        sized: dict[str, int] = {}

        def hybrid_req_to_token_pool(*, size: int, mamba_size: int, **_kw: Any) -> None:
            sized.update(reqs=size, slots=mamba_size)
            raise _Stop  # the sizes are final; the rest allocates tensors

        ns["HybridReqToTokenPool"] = hybrid_req_to_token_pool
        runner = types.SimpleNamespace(
            server_args=args, mambaish_config=types.SimpleNamespace(mamba2_cache_params=params),
            hybrid_gdn_config=object(), model=None, dtype="bfloat16", pp_size=1, is_hybrid_swa=False,
            req_to_token_pool=None, device="cpu", model_config=types.SimpleNamespace(context_len=inp.context_len),
            spec_algorithm=types.SimpleNamespace(is_eagle=lambda: False, is_standalone=lambda: False),
        )  # fmt: skip

        def profile_max_num_token(_total: int) -> int:
            rest = ns["handle_max_mamba_cache"](runner, inp.pool_bytes / GIB)  # model_runner.py:1442-1448
            return int(rest * (1 << 30) // inp.kv_bytes_per_token)

        runner.profile_max_num_token = profile_max_num_token
        try:
            ns["init_memory_pool"](runner, 0, inp.max_running_requests, inp.max_total_tokens)
        except _Stop:
            pass
        if not sized:
            raise RuntimeError("0.5.6 found no memory for the pools")
        return sized["slots"], runner.max_total_num_tokens, sized["reqs"]


class Release0510:
    def __init__(self) -> None:
        path = release_srt("0.5.10") / "model_executor" / "model_runner_kv_cache_mixin.py"
        ns: dict[str, Any] = {"logging": logging, "logger": logging.getLogger("sglang-0.5.10"), "Optional": Optional}
        consts = {
            "MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO",
            "MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP",
            "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP",
        }
        exec_lifted(lift(path, consts), path, ns)
        methods = {
            "handle_max_mamba_cache", "_calculate_mamba_ratio", "_resolve_token_capacity", "_resolve_max_num_reqs",
        }  # fmt: skip
        exec_lifted(lift(path, methods, "ModelRunnerKVCacheMixin"), path, ns)
        self.ns = ns

    def size(self, inp: PoolInputs) -> tuple[int, int, int]:
        """(max_mamba_cache_size, max_total_num_tokens, max_running_requests) as 0.5.10 computes them."""
        ns = self.ns
        draft = inp.speculative_num_draft_tokens
        running = inp.max_running_requests
        if draft and running is None:
            running = 48  # server_args.py: speculative decoding's default
        extra = inp.strategy == "extra_buffer"
        args = types.SimpleNamespace(
            speculative_num_draft_tokens=draft or None, disable_radix_cache=inp.disable_radix_cache,
            max_mamba_cache_size=inp.max_mamba_cache_size, max_running_requests=running,
            mamba_full_memory_ratio=inp.mamba_full_memory_ratio, page_size=inp.page_size, enable_dp_attention=False,
            dp_size=1, max_total_tokens=inp.max_total_tokens, disable_overlap_schedule=not inp.overlap_schedule,
            enable_mamba_extra_buffer=lambda: extra,
        )  # fmt: skip
        params = types.SimpleNamespace(mamba_cache_per_req=inp.mamba_state_bytes_per_request)
        runner = types.SimpleNamespace(
            server_args=args, mambaish_config=types.SimpleNamespace(mamba2_cache_params=params), dp_size=1,
            pp_size=1, model_config=types.SimpleNamespace(context_len=inp.context_len),
            spec_algorithm=types.SimpleNamespace(is_none=lambda: draft == 0),
        )  # fmt: skip
        runner._calculate_mamba_ratio = lambda: ns["_calculate_mamba_ratio"](runner)
        rest = ns["handle_max_mamba_cache"](runner, inp.pool_bytes / GIB)
        profiled = int(rest * (1 << 30)) // inp.kv_bytes_per_token  # kv_cache_mixin.py:175-177
        tokens = ns["_resolve_token_capacity"](runner, profiled)
        return args.max_mamba_cache_size, tokens, ns["_resolve_max_num_reqs"](runner, tokens)


REFERENCES = {"0.5.6": Release056, "0.5.10": Release0510}


@pytest.fixture(scope="module", params=sorted(REFERENCES))
def release(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, REFERENCES[request.param]()


def _ours(version: str, inp: PoolInputs) -> tuple[int, int, int] | None:
    try:
        plan = size_pools(PoolInputs(**{**inp.__dict__, "release": release_sizing(version)}))
    except PoolSizingError:
        return None
    return plan.max_mamba_cache_size, plan.max_total_num_tokens, plan.max_running_requests


def _theirs(ref: Any, inp: PoolInputs) -> tuple[int, int, int] | None:
    try:
        k, tokens, reqs = ref.size(inp)
    except (RuntimeError, ValueError, ZeroDivisionError):
        return None
    # Where SGLang goes on with no slot, no KV page or no request it fails later, at allocation or first use;
    # hybridctl refuses up front. Both mean "does not fit".
    return None if min(k, tokens, reqs) <= 0 else (k, tokens, reqs)


@st.composite
def pool_inputs(draw: st.DrawFn, version: str) -> PoolInputs:
    strategy, overlap = draw(st.sampled_from([("no_buffer", False), ("extra_buffer", True), ("extra_buffer", False)]))
    return PoolInputs(
        pool_bytes=draw(st.integers(256 << 20, 200 * GIB)),
        mamba_state_bytes_per_request=draw(st.integers(1 << 16, 300 << 20)),
        kv_bytes_per_token=draw(st.integers(512, 300_000)),
        page_size=draw(st.sampled_from([1, 16, 64])),
        mamba_full_memory_ratio=draw(st.floats(0.05, 5.0, allow_nan=False)),
        max_mamba_cache_size=draw(st.one_of(st.none(), st.integers(1, 4096))),
        max_running_requests=draw(st.one_of(st.none(), st.integers(1, 1024))),
        disable_radix_cache=draw(st.booleans()),
        strategy=strategy if version != "0.5.6" else "no_buffer",
        overlap_schedule=overlap,
        speculative_num_draft_tokens=0 if version == "0.5.6" else draw(st.sampled_from([0, 0, 2, 4, 8])),
        context_len=draw(st.sampled_from([4096, 32768, 262144])),
        max_total_tokens=draw(st.one_of(st.none(), st.integers(1, 4_000_000))),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_size_pools_matches_the_releases_own_code(release: tuple[str, Any], data: st.DataObject) -> None:
    version, ref = release
    inp = data.draw(pool_inputs(version))
    assert _ours(version, inp) == _theirs(ref, inp)


# Qwen3-Next-80B-A3B, fp32 SSM state, a fixed pool (the planner test cases of test_planner_sglang.py):
# hybridctl plan --model templates/models/qwen3-next-80b-a3b.json --tp TP --pool-bytes N --sglang-version X
CASES = [
    (1, 40 * GIB, {"strategy": "extra_buffer", "overlap_schedule": True}),
    (1, 40 * GIB, {"strategy": "no_buffer", "overlap_schedule": False}),
    (4, 30 * GIB, {"strategy": "extra_buffer", "overlap_schedule": True}),
    (4, 30 * GIB, {"strategy": "extra_buffer", "overlap_schedule": True, "speculative_num_draft_tokens": 4}),
]


@pytest.mark.parametrize(("tp", "pool", "kw"), CASES)
def test_plan_for_a_release_equals_its_own_sizing(release: tuple[str, Any], tp: int, pool: int, kw: dict) -> None:
    version, ref = release
    if version == "0.5.6" and kw.get("speculative_num_draft_tokens"):
        pytest.skip("0.5.6 re-sizes the KV pool for speculative headroom, which hybridctl does not model")
    spec = load_model_shape_or_bundled(TEMPLATES / "qwen3-next-80b-a3b.json", tp=tp, ssm_dtype="float32")
    inp = PoolInputs(
        pool_bytes=pool, mamba_state_bytes_per_request=spec.mamba_state_bytes_per_request,
        kv_bytes_per_token=spec.kv_bytes_per_token, context_len=spec.context_len, **kw,
    )  # fmt: skip
    if version == "0.5.6":  # no strategies in 0.5.6: the radix cache always keeps 3 slots per request
        inp = PoolInputs(**{**inp.__dict__, "strategy": "no_buffer"})
    theirs = ref.size(inp)
    assert _ours(version, inp) == theirs
    # ... and `plan --sglang-version X` (make_plan) says the same for the config that means these inputs.
    cfg = HybridConfig.model_validate({"config": {"cache": {"mamba_radix_cache_strategy": kw["strategy"]}}})
    plan = make_plan(
        cfg, spec, pool_bytes=pool, overlap_schedule=kw["overlap_schedule"],
        speculative_num_draft_tokens=kw.get("speculative_num_draft_tokens", 0), sglang_version=version,
    )  # fmt: skip
    p = plan.pools
    assert (p.max_mamba_cache_size, p.max_total_num_tokens, p.max_running_requests) == theirs
