"""Build the tiny demo model: a ~10M-parameter Qwen3-Next with random weights and a BPE tokenizer.

The files are exactly what a Hugging Face Qwen3-Next checkpoint holds (config.json, model.safetensors with HF
tensor names, tokenizer.json, tokenizer_config.json, generation_config.json), so the bundled runtime,
transformers and SGLang can all load the directory. Nothing is downloaded: weights come from a seeded
generator and the tokenizer is trained on the corpus shipped in runtime/data/.

    python -m runtime.demo_model --out DIR [--seed 0] [--force]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

CORPUS = Path(__file__).parent / "data" / "demo_corpus.txt"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Shapes of the demo: 8 layers, 3 gated-DeltaNet layers per full-attention layer, 8 experts (top-2) plus a
# shared expert. Small enough to build in seconds and run on a laptop CPU, big enough to exercise every path.
DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 8,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "use_cache": True,
    "router_aux_loss_coef": 0.001,
    "output_router_logits": False,
    "dtype": "float32",
}


class DemoModelError(Exception):
    """The demo model cannot be written (existing directory without --force, missing corpus)."""


def _token_ids(tokenizer_json: dict[str, object]) -> dict[str, int]:
    added = tokenizer_json["added_tokens"]
    assert isinstance(added, list)
    return {t["content"]: t["id"] for t in added}


def _weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Random weights with HF tensor names, drawn in a fixed order from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)

    def num(key: str) -> int:
        value = config[key]
        assert isinstance(value, int)
        return value

    std = float(config["initializer_range"])
    hidden, vocab = num("hidden_size"), num("vocab_size")

    # Drawn in fp32 and rounded tensor by tensor to the config's dtype: a bfloat16 checkpoint holds the same
    # draws as the float32 one, and a large one never exists in fp32 as a whole.
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[str(config.get("dtype", "float32"))]

    def normal(*shape: int, scale: float = std) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    def uniform(lo: float, hi: float, *shape: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=gen) * (hi - lo) + lo).to(dtype)

    heads, kv_heads, head_dim = num("num_attention_heads"), num("num_key_value_heads"), num("head_dim")
    nk, nv = num("linear_num_key_heads"), num("linear_num_value_heads")
    dk, dv = num("linear_key_head_dim"), num("linear_value_head_dim")
    kernel = num("linear_conv_kernel_dim")
    experts, moe_i = num("num_experts"), num("moe_intermediate_size")
    shared_i = num("shared_expert_intermediate_size")
    conv_dim = 2 * nk * dk + nv * dv
    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{i}"
        # RMSNorm weights are offsets from 1 in Qwen3-Next; small noise keeps them near identity.
        w[f"{p}.input_layernorm.weight"] = normal(hidden, scale=0.1)
        w[f"{p}.post_attention_layernorm.weight"] = normal(hidden, scale=0.1)
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            w[f"{a}.in_proj_qkvz.weight"] = normal(2 * nk * dk + 2 * nv * dv, hidden)
            w[f"{a}.in_proj_ba.weight"] = normal(2 * nv, hidden)
            w[f"{a}.conv1d.weight"] = uniform(-1 / math.sqrt(kernel), 1 / math.sqrt(kernel), conv_dim, 1, kernel)
            w[f"{a}.dt_bias"] = torch.ones(nv, dtype=dtype)
            w[f"{a}.A_log"] = uniform(0.01, 16, nv).log()
            w[f"{a}.norm.weight"] = torch.ones(dv, dtype=dtype)
            w[f"{a}.out_proj.weight"] = normal(hidden, nv * dv)
        else:
            a = f"{p}.self_attn"
            w[f"{a}.q_proj.weight"] = normal(2 * heads * head_dim, hidden)
            w[f"{a}.k_proj.weight"] = normal(kv_heads * head_dim, hidden)
            w[f"{a}.v_proj.weight"] = normal(kv_heads * head_dim, hidden)
            w[f"{a}.o_proj.weight"] = normal(hidden, heads * head_dim)
            w[f"{a}.q_norm.weight"] = normal(head_dim, scale=0.1)
            w[f"{a}.k_norm.weight"] = normal(head_dim, scale=0.1)
        m = f"{p}.mlp"
        w[f"{m}.gate.weight"] = normal(experts, hidden)
        for e in range(experts):
            w[f"{m}.experts.{e}.gate_proj.weight"] = normal(moe_i, hidden)
            w[f"{m}.experts.{e}.up_proj.weight"] = normal(moe_i, hidden)
            w[f"{m}.experts.{e}.down_proj.weight"] = normal(hidden, moe_i)
        w[f"{m}.shared_expert.gate_proj.weight"] = normal(shared_i, hidden)
        w[f"{m}.shared_expert.up_proj.weight"] = normal(shared_i, hidden)
        w[f"{m}.shared_expert.down_proj.weight"] = normal(hidden, shared_i)
        w[f"{m}.shared_expert_gate.weight"] = normal(1, hidden)
    w["model.norm.weight"] = normal(hidden, scale=0.1)
    w["lm_head.weight"] = normal(vocab, hidden)
    return w


def _train_tokenizer(vocab_size: int) -> dict[str, object]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if not CORPUS.is_file():
        raise DemoModelError(f"{CORPUS}: the shipped tokenizer corpus is missing; reinstall hybridctl.")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(CORPUS)], trainer)
    return json.loads(tok.to_str())


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def build_demo_model(
    out_dir: str | Path, *, seed: int = 0, force: bool = False, config: Mapping[str, Any] | None = None
) -> Path:
    """Write the demo model into `out_dir` and return it. The same seed gives byte-identical files.
    `config`: the model config to build instead of DEMO_CONFIG (a variant of it: benchmarks/peers/peer_model.py).

    The directory is assembled next to its destination and renamed into place, so a crash never leaves a
    half-written model behind.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DemoModelError(f"{out}: exists and is not a directory; choose a directory path for --out.")
    if out.exists() and any(out.iterdir()) and not force:
        raise DemoModelError(f"{out}: already exists and is not empty; pass --force to replace it.")
    config = dict(DEMO_CONFIG if config is None else config)
    tokenizer_json = _train_tokenizer(int(config["vocab_size"]))
    ids = _token_ids(tokenizer_json)
    config.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=None)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        staging.chmod(0o755)
        _write_json(staging / "config.json", config)
        save_file(_weights(config, seed), str(staging / "model.safetensors"), metadata={"format": "pt"})
        _write_json(staging / "tokenizer.json", tokenizer_json)
        _write_json(
            staging / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "add_bos_token": False,
                "add_eos_token": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": int(config["max_position_embeddings"]),
                "chat_template": CHAT_TEMPLATE,
            },
        )
        _write_json(
            staging / "generation_config.json",
            {
                "bos_token_id": ids["<|endoftext|>"],
                "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                "pad_token_id": ids["<|endoftext|>"],
                "do_sample": False,
            },
        )
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.demo_model", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (same seed, same bytes)")
    parser.add_argument("--force", action="store_true", help="replace an existing directory")
    args = parser.parse_args(argv)
    return run_build(lambda: build_demo_model(args.out, seed=args.seed, force=args.force), args.out)


def run_build(build: Callable[[], Path], out: Path) -> int:
    """A model-building CLI's body: print the model's path (0), or a one-line error for a refused or
    unwritable `--out` (2), never a traceback. This CLI's and benchmarks/peers/peer_model.py's."""
    try:
        path = build()
    except DemoModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"error: cannot write the demo model to {out}: {exc.strerror or exc} "
            f"({exc.filename or out}); choose a writable directory for --out.",
            file=sys.stderr,
        )
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
