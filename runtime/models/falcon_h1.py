"""Falcon-H1: every layer runs attention and a Mamba2 mixer in parallel on the same normed input, then a
SwiGLU MLP; muP multipliers scale embeddings, keys, each branch's input/output, the MLP and the logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.base import StepContext
from runtime.models.decoder import PARALLEL, CosSin, DecoderBody, DecoderLM, HybridLayer
from runtime.models.errors import ModelLoadError
from runtime.models.hf_config import HFConfig
from runtime.models.layers.mamba2 import GatedNorm, Mamba2Mixer
from runtime.models.layers.norm import RMSNorm
from runtime.models.layers.rotary import RotaryEmbedding
from runtime.models.layers.rotary_attention import AttentionOptions, RotaryAttention


@dataclass(frozen=True)
class FalconH1Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attention_bias: bool
    mlp_bias: bool
    rms_norm_eps: float
    rope_theta: float
    mamba_d_ssm: int
    mamba_n_heads: int
    mamba_d_head: int
    mamba_n_groups: int
    mamba_d_state: int
    mamba_d_conv: int
    mamba_chunk_size: int
    mamba_conv_bias: bool
    mamba_proj_bias: bool
    projectors_bias: bool
    mamba_norm_before_gate: bool
    mamba_rms_norm: bool
    dt_limit: tuple[float, float]
    embedding_multiplier: float
    lm_head_multiplier: float
    key_multiplier: float
    attention_in_multiplier: float
    attention_out_multiplier: float
    ssm_in_multiplier: float
    ssm_out_multiplier: float
    ssm_multipliers: tuple[float, ...]
    mlp_multipliers: tuple[float, float]
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, cfg: HFConfig) -> FalconH1Config:
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ModelLoadError(
                f"{cfg.path}: 'hidden_act' is '{act}'; the bundled runtime implements Falcon-H1 with silu "
                "only. Serve this model with SGLang."
            )
        hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
        d_ssm = cfg.data.get("mamba_d_ssm") or cfg.int("mamba_expand", 2) * hidden
        mamba_heads = cfg.int("mamba_n_heads")
        d_head = cfg.data.get("mamba_d_head", "auto")
        if d_head in (None, "auto"):
            d_head = d_ssm // mamba_heads
        theta, _ = cfg.rope()
        ssm_multipliers = tuple(float(m) for m in (cfg.data.get("ssm_multipliers") or (1.0,) * 5))
        mlp_multipliers = tuple(float(m) for m in (cfg.data.get("mlp_multipliers") or (1.0, 1.0)))
        if len(ssm_multipliers) != 5 or len(mlp_multipliers) != 2:
            raise ModelLoadError(
                f"{cfg.path}: 'ssm_multipliers' needs 5 numbers and 'mlp_multipliers' 2; fix the file."
            )
        return cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=cfg.int("intermediate_size"),
            num_hidden_layers=cfg.int("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=cfg.int("num_key_value_heads", None) or heads,
            head_dim=cfg.int("head_dim", hidden // heads),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            rms_norm_eps=cfg.float("rms_norm_eps", 1e-5),
            rope_theta=theta,
            mamba_d_ssm=int(d_ssm),
            mamba_n_heads=mamba_heads,
            mamba_d_head=int(d_head),
            mamba_n_groups=cfg.int("mamba_n_groups", 1),
            mamba_d_state=cfg.int("mamba_d_state"),
            mamba_d_conv=cfg.int("mamba_d_conv", 4),
            mamba_chunk_size=cfg.int("mamba_chunk_size", 256),
            mamba_conv_bias=bool(cfg.get("mamba_conv_bias", True)),
            mamba_proj_bias=bool(cfg.get("mamba_proj_bias", False)),
            projectors_bias=bool(cfg.get("projectors_bias", False)),
            mamba_norm_before_gate=bool(cfg.get("mamba_norm_before_gate", True)),
            mamba_rms_norm=bool(cfg.get("mamba_rms_norm", False)),
            dt_limit=cfg.float_pair("time_step_limit", (0.0, float("inf"))),
            embedding_multiplier=cfg.float("embedding_multiplier", 1.0),
            lm_head_multiplier=cfg.float("lm_head_multiplier", 1.0),
            key_multiplier=cfg.float("key_multiplier", 1.0),
            attention_in_multiplier=cfg.float("attention_in_multiplier", 1.0),
            attention_out_multiplier=cfg.float("attention_out_multiplier", 1.0),
            ssm_in_multiplier=cfg.float("ssm_in_multiplier", 1.0),
            ssm_out_multiplier=cfg.float("ssm_out_multiplier", 1.0),
            ssm_multipliers=ssm_multipliers,
            mlp_multipliers=(mlp_multipliers[0], mlp_multipliers[1]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )


class FalconH1MLP(nn.Module):
    def __init__(self, c: FalconH1Config) -> None:
        super().__init__()
        self.gate_multiplier, self.down_multiplier = c.mlp_multipliers
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up_proj(x) * F.silu(self.gate_proj(x) * self.gate_multiplier)
        return self.down_proj(h) * self.down_multiplier


class FalconH1DecoderLayer(HybridLayer):
    def __init__(self, c: FalconH1Config, index: int) -> None:
        super().__init__(PARALLEL, index)  # every layer holds both KV and Mamba state: one ordinal for both pools
        self.c = c
        gated: GatedNorm | None = (
            ("norm_then_gate" if c.mamba_norm_before_gate else "gate_then_norm") if c.mamba_rms_norm else None
        )
        self.mamba = Mamba2Mixer(
            c.hidden_size,
            c.mamba_n_heads,
            c.mamba_d_head,
            c.mamba_d_state,
            c.mamba_n_groups,
            c.mamba_d_conv,
            c.mamba_chunk_size,
            c.dt_limit,
            c.rms_norm_eps,
            c.mamba_proj_bias,
            c.mamba_conv_bias,
            out_bias=c.projectors_bias,
            in_multiplier=c.ssm_in_multiplier,
            proj_multipliers=c.ssm_multipliers,
            gated_norm=gated or "gate_only",
        )
        self.self_attn = RotaryAttention(
            AttentionOptions(
                c.hidden_size,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
                bias=c.attention_bias,
                key_multiplier=c.key_multiplier,
            )
        )
        self.feed_forward = FalconH1MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=False)
        self.pre_ff_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=False)

    def forward(self, x: torch.Tensor, cos_sin: CosSin, ctx: StepContext) -> torch.Tensor:
        c = self.c
        h = self.input_layernorm(x)
        ssm = self.recur(self.mamba, h, ctx)
        attn = self.attend(self.self_attn, h * c.attention_in_multiplier, cos_sin, ctx)
        x = x + ssm * c.ssm_out_multiplier + attn * c.attention_out_multiplier
        return x + self.feed_forward(self.pre_ff_layernorm(x))


class FalconH1ForCausalLM(DecoderLM):
    def __init__(self, config: FalconH1Config) -> None:
        c = config
        body = DecoderBody(
            nn.Embedding(c.vocab_size, c.hidden_size),
            [FalconH1DecoderLayer(c, i) for i in range(c.num_hidden_layers)],
            RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=False),
            norm_name="final_layernorm",
        )
        super().__init__(
            config,
            body,
            layer_types=(PARALLEL,) * c.num_hidden_layers,
            kv_shape=(c.num_key_value_heads, c.head_dim, c.head_dim),
            hidden_size=c.hidden_size,
            vocab_size=c.vocab_size,
            rotary=RotaryEmbedding(c.head_dim, c.head_dim, c.rope_theta),
            embedding_multiplier=c.embedding_multiplier,
        )
        self.config: FalconH1Config = config

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.config.lm_head_multiplier
