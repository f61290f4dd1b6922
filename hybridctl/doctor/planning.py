"""How the chosen engine would size its pools for a config: the planner, called the way each engine calls it.

SGLang: `make_plan` with the GPU's memory. The bundled runtime (runtime/engine/pool_setup.py) differs in three
ways that change the numbers: `auto` means extra_buffer, there is no overlap schedule, and on CPU the KV cache
is float32 in a memory budget (memory.memory_budget_gib, default 4 GiB). Remedies re-plan candidate configs
through `PlanContext.plan`, so every value doctor suggests is one the planner accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridctl.config.schema import HybridConfig
from hybridctl.model.spec import ModelSpec
from hybridctl.planner.memory import builtin_budget_bytes
from hybridctl.planner.plan import Plan, make_plan


@dataclass(frozen=True)
class PlanContext:
    spec: ModelSpec
    engine: str  # sglang | builtin
    gpu_mem_bytes: int

    def plan(self, cfg: HybridConfig, **overrides: Any) -> Plan:
        """make_plan for `cfg` as this engine does it; raises PoolSizingError like the engine would."""
        if self.engine == "builtin":
            cache = cfg.config.cache
            if "strategy" not in overrides and cache.mamba_radix_cache_strategy == "auto":
                overrides["strategy"] = "extra_buffer"
            overrides.setdefault("overlap_schedule", False)
            gpu = builtin_budget_bytes(cfg)
        else:
            gpu = self.gpu_mem_bytes
        return make_plan(cfg, self.spec_for(cfg), gpu_mem_bytes=gpu, **overrides)

    def spec_for(self, cfg: HybridConfig) -> ModelSpec:
        """The model at `cfg`'s state dtype and TP size (a remedy may change either)."""
        dtype, tp = cfg.settings.mamba.state_dtype, cfg.config.server.tp_size
        if (dtype, tp) == (self.spec.ssm_dtype, self.spec.tp):
            return self.spec
        from hybridctl.model.spec import load_model_spec

        return load_model_spec(self.spec.source, tp=tp, ssm_dtype=dtype, kv_dtype=self.spec.kv_dtype)


def load_plan_context(
    cfg: HybridConfig, engine: str, gpu_mem_bytes: int | None
) -> tuple[PlanContext | None, str]:
    """The context, or None and why planning is skipped (no model path, bad config.json, no GPU size)."""
    from hybridctl.model.errors import ModelSpecError
    from hybridctl.model.spec import load_model_spec

    path = cfg.config.server.model_path
    if not path:
        return None, "server.model_path is empty in config.toml: no model to plan for"
    # The bundled runtime computes in float32 on CPU, so its KV cache is float32 (pool_setup.py).
    kv_dtype = "float32" if engine == "builtin" else "bfloat16"
    try:
        spec = load_model_spec(
            path, tp=cfg.config.server.tp_size, ssm_dtype=cfg.settings.mamba.state_dtype, kv_dtype=kv_dtype
        )
    except ModelSpecError as exc:
        return None, str(exc)
    if engine == "builtin":
        return PlanContext(spec, engine, 0), ""
    if gpu_mem_bytes is None:
        return None, "no GPU found and no --gpu-mem-gib given: cannot size SGLang's pools"
    return PlanContext(spec, engine, gpu_mem_bytes), ""
