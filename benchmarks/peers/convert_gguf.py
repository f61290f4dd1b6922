"""Convert the benchmark's HF model directory to GGUF with llama.cpp's own converter (no MTP).

    python benchmarks/peers/convert_gguf.py MODEL_DIR OUT.gguf [f32|bf16|q8_0]

f32 (the default) holds the fp32 weights' own values; bf16 is a bf16 checkpoint's bytes as they are; q8_0 is what a
llama.cpp user would pick for a CPU (8-bit blocks of 32, a quarter of f32's bytes).

The converter refuses a BPE tokenizer whose pre-tokenizer hash it does not know. The demo model's tokenizer is
a byte-level BPE with the GPT-2 split regex (tokenizers' ByteLevel pre-tokenizer), which llama.cpp calls
`gpt-2`; this wrapper answers `gpt-2` only when the converter's own table has no entry, at run time, so the
vendored source stays as shipped. Likewise at run time: a dense Nemotron-H's "mlp" layers (below).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from setup_llamacpp import CONVERTER, GGUF_PY, SRC

OUTTYPES = ("f32", "bf16", "q8_0")


def _dense_nemotron_h_mlp_layers() -> None:
    """transformers 5 writes a Nemotron-H's layer pattern as a list (`layers_block_type`), where a dense MLP layer
    is "mlp", and writes its MoE defaults (`num_experts_per_tok`, `n_routed_experts`, ...) into every config. The
    converter's list form knows only "moe" layers and takes those keys for a MoE model, so a dense model came out
    as MoE with its MLP layers missing (llama.cpp: `tensor 'blk.1.ssm_in.weight' not found`). Here a list with no
    "moe" layer converts as the dense model it is, its "mlp" layers as the string form's "-"."""
    from conversion.base import ModelBase
    from conversion.nemotron import NemotronHModel

    NemotronHModel._MLP_LAYER_TYPES = NemotronHModel._MLP_LAYER_TYPES | {"mlp"}
    original = ModelBase.load_hparams

    def load_hparams(dir_model: Path, is_mistral_format: bool) -> dict[str, Any]:
        hparams: dict[str, Any] = original(dir_model, is_mistral_format)
        blocks = hparams.get("layers_block_type")
        if hparams.get("model_type") == "nemotron_h" and isinstance(blocks, list) and "moe" not in blocks:
            routing = ("n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor")
            for key in [k for k in hparams if "expert" in k or k.startswith("moe_") or k in routing]:
                del hparams[key]
        return hparams

    ModelBase.load_hparams = staticmethod(load_hparams)  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] not in OUTTYPES):
        print(f"usage: convert_gguf.py MODEL_DIR OUT.gguf [{'|'.join(OUTTYPES)}]", file=sys.stderr)
        return 2
    model_dir, out = Path(argv[0]), Path(argv[1])
    outtype = argv[2] if len(argv) == 3 else "f32"
    if not CONVERTER.is_file():
        print(f"error: {CONVERTER} missing; run python benchmarks/peers/setup_llamacpp.py", file=sys.stderr)
        return 2
    sys.path[:0] = [str(SRC), str(GGUF_PY)]
    import convert_hf_to_gguf
    from conversion.base import TextModel

    original = TextModel.get_vocab_base_pre

    def vocab_base_pre(self: TextModel, tokenizer: object) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            return "gpt-2"

    TextModel.get_vocab_base_pre = vocab_base_pre  # type: ignore[method-assign]
    _dense_nemotron_h_mlp_layers()
    tmp = out.with_name(out.name + ".partial")
    sys.argv = [
        "convert_hf_to_gguf.py",
        str(model_dir),
        "--outfile",
        str(tmp),
        "--outtype",
        outtype,
        "--no-mtp",
    ]
    convert_hf_to_gguf.main()
    tmp.replace(out)  # a converter crash never leaves a file run.py would take for a finished one
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
