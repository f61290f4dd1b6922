"""Which model class serves which HF `model_type` / `architectures` entry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runtime.models.base import HybridModel
from runtime.models.errors import ModelLoadError
from runtime.models.hf_config import HFConfig


@dataclass(frozen=True)
class ModelEntry:
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    build: Callable[[HFConfig], HybridModel]


def _qwen3_next(cfg: HFConfig) -> HybridModel:
    from runtime.models.qwen3_next import Qwen3NextConfig, Qwen3NextForCausalLM

    return Qwen3NextForCausalLM(Qwen3NextConfig.from_hf(cfg))


def _qwen3_5(cfg: HFConfig) -> HybridModel:
    from runtime.models.qwen3_next import Qwen3NextConfig, Qwen3NextForCausalLM

    return Qwen3NextForCausalLM(Qwen3NextConfig.from_hf(cfg.text_config(), split_projections=True))


def _nemotron_h(cfg: HFConfig) -> HybridModel:
    from runtime.models.nemotron_h import NemotronHConfig, NemotronHForCausalLM

    return NemotronHForCausalLM(NemotronHConfig.from_hf(cfg))


def _granite_hybrid(cfg: HFConfig) -> HybridModel:
    from runtime.models.granite_hybrid import GraniteHybridConfig, GraniteHybridForCausalLM

    return GraniteHybridForCausalLM(GraniteHybridConfig.from_hf(cfg))


def _falcon_h1(cfg: HFConfig) -> HybridModel:
    from runtime.models.falcon_h1 import FalconH1Config, FalconH1ForCausalLM

    return FalconH1ForCausalLM(FalconH1Config.from_hf(cfg))


def _kimi_linear(cfg: HFConfig) -> HybridModel:
    from runtime.models.kimi_linear import KimiLinearConfig, KimiLinearForCausalLM

    return KimiLinearForCausalLM(KimiLinearConfig.from_hf(cfg))


REGISTRY: tuple[ModelEntry, ...] = (
    ModelEntry(("qwen3_next",), ("Qwen3NextForCausalLM",), _qwen3_next),
    ModelEntry(
        ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
        (
            "Qwen3_5ForCausalLM",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForCausalLM",
            "Qwen3_5MoeForConditionalGeneration",
        ),
        _qwen3_5,
    ),
    ModelEntry(("nemotron_h",), ("NemotronHForCausalLM",), _nemotron_h),
    ModelEntry(("granitemoehybrid",), ("GraniteMoeHybridForCausalLM",), _granite_hybrid),
    ModelEntry(("falcon_h1",), ("FalconH1ForCausalLM",), _falcon_h1),
    ModelEntry(("kimi_linear",), ("KimiLinearForCausalLM",), _kimi_linear),
)


def supported_model_types() -> list[str]:
    return [t for entry in REGISTRY for t in entry.model_types]


def resolve(cfg: HFConfig) -> ModelEntry:
    model_type = cfg.data.get("model_type")
    architectures = cfg.data.get("architectures") or []
    for entry in REGISTRY:
        if model_type in entry.model_types or any(a in entry.architectures for a in architectures):
            return entry
    raise ModelLoadError(
        f"{cfg.path}: model_type '{model_type}' (architectures {architectures}) is not supported by the "
        f"bundled runtime, which runs {', '.join(supported_model_types())}. Serve this model with SGLang "
        'instead (engine = "sglang" in config.toml).'
    )
