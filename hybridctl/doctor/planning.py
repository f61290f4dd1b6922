"""How the chosen engine would size its pools for a config: the planner, called the way each engine calls it.

SGLang: `make_plan` with the GPU's memory. The bundled runtime: `plan_builtin`, the sizing function the runtime
itself calls at start-up (hybridshared/sizing/runtime_pools.py), on the GPU when one is given (--gpu-mem-gib or
probed), else in its CPU memory budget. Remedies re-plan candidate configs through `PlanContext.plan`, so every
value doctor suggests is one the planner accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridctl.config.schema import HybridConfig
from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridctl.planner.builtin_sizing import builtin_model_shape, plan_builtin
from hybridctl.planner.plan import Plan, make_plan
from hybridctl.planner.plan_request import recorded_gpu_mem_bytes
from hybridshared.model.errors import ModelShapeError
from hybridshared.model.shape import ModelShape


@dataclass(frozen=True)
class PlanContext:
    spec: ModelShape
    engine: str  # sglang | builtin
    gpu_mem_bytes: int

    def plan(self, cfg: HybridConfig, **overrides: Any) -> Plan:
        """`cfg`'s pools as this engine sizes them; raises PoolSizingError like the engine would."""
        if self.engine == "builtin":
            gpu = self.gpu_mem_bytes or None  # 0: the runtime on CPU, in memory.memory_budget_gib
            return plan_builtin(cfg, self.spec.source, gpu_mem_bytes=gpu, tp=cfg.config.server.tp_size)[1]
        return make_plan(cfg, self.spec_for(cfg), gpu_mem_bytes=self.gpu_mem_bytes, **overrides)

    def spec_for(self, cfg: HybridConfig) -> ModelShape:
        """The model at `cfg`'s state dtype and TP size (a remedy may change either)."""
        dtype, tp = cfg.settings.mamba.state_dtype, cfg.config.server.tp_size
        if (dtype, tp) == (self.spec.ssm_dtype, self.spec.tp):
            return self.spec

        return load_model_shape_or_bundled(self.spec.source, tp=tp, ssm_dtype=dtype, kv_dtype=self.spec.kv_dtype)


def load_plan_context(cfg: HybridConfig, engine: str, gpu_mem_bytes: int | None) -> tuple[PlanContext | None, str]:
    """The context, or None and why planning is skipped (no model path, bad config.json, no GPU size)."""

    path = cfg.config.server.model_path
    if not path:
        return None, "server.model_path is empty in config.toml: no model to plan for"
    if gpu_mem_bytes is None:  # no --gpu-mem-gib, no GPU here: the server's GPU as init recorded it, as plan
        gpu_mem_bytes = recorded_gpu_mem_bytes(cfg, engine)
    try:
        if engine == "builtin":  # the model as the runtime holds it (activation dtype: float32 on CPU)
            tp = cfg.config.server.tp_size
            spec = builtin_model_shape(cfg, path, tp=tp, on_gpu=gpu_mem_bytes is not None)
            return PlanContext(spec, engine, gpu_mem_bytes or 0), ""
        spec = load_model_shape_or_bundled(path, tp=cfg.config.server.tp_size, ssm_dtype=cfg.settings.mamba.state_dtype)
    except ModelShapeError as exc:
        return None, str(exc)
    if gpu_mem_bytes is None:
        return None, "no GPU found and no --gpu-mem-gib given: cannot size SGLang's pools"
    return PlanContext(spec, engine, gpu_mem_bytes), ""
