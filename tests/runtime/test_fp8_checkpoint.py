"""FP8 block-quantized checkpoints (the DeepSeek-V3 / Qwen3-Next-80B-A3B-Instruct-FP8 layout: float8_e4m3fn weights,
fp32 `weight_scale_inv` per [bn, bk] block, `quantization_config` {"quant_method": "fp8", "weight_block_size"}) load
through the real loader, dequantized per block; other quantizations are refused naming SGLang; running out of memory
while the weights load is an error that says what to change."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.models import load_model
from runtime.models.errors import ModelLoadError
from runtime.models.loader import weights_fit
from tests.runtime.simple_runner import SimpleRunner
from tests.runtime.test_engine_support import build_tiny_qwen3_next, one_torch_thread

FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
# Kept in their own dtype, as Qwen3-Next's FP8 release does (modules_to_not_convert): embeddings, lm_head, norms,
# the router and the shared-expert gate.
UNQUANTIZED = ("embed_tokens", "lm_head", "norm", "mlp.gate.weight", "shared_expert_gate")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def quantize_blocks(w: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's block quantization: per [bn, bk] block, scale = amax / 448, q = w / scale in e4m3;
    `weight_scale_inv` is that scale (dequantized w = q * scale_inv). Ragged edge blocks are partial."""
    n, k = w.shape
    scale = torch.empty(-(-n // bn), -(-k // bk))
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].float()
            s = block.abs().max().clamp(min=1e-12) / FP8_MAX
            scale[i, j] = s
            q[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = (block / s).to(torch.float8_e4m3fn)
    return q, scale


def write_fp8_copy(src: Path, dst: Path, block: tuple[int, int]) -> tuple[Path, Path]:
    """`dst/fp8`: src's 2-D linear weights block-quantized; `dst/dequantized`: the same values as fp32 (q * scale),
    so a loader that dequantizes correctly gives identical logits for both."""
    tensors = load_file(str(src / "model.safetensors"))
    fp8: dict[str, torch.Tensor] = {}
    plain: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if t.dim() == 2 and name.endswith(".weight") and not any(u in name for u in UNQUANTIZED):
            q, s = quantize_blocks(t, *block)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            rows = s.repeat_interleave(block[0], 0)[: t.shape[0]].repeat_interleave(block[1], 1)[:, : t.shape[1]]
            plain[name] = q.float() * rows
        else:
            fp8[name] = plain[name] = t
    config = json.loads((src / "config.json").read_text())
    out = []
    for kind, weights in (("fp8", fp8), ("dequantized", plain)):
        d = dst / kind
        d.mkdir(parents=True)
        cfg = dict(config)
        if kind == "fp8":
            cfg["quantization_config"] = {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "activation_scheme": "dynamic",
                "weight_block_size": list(block),
            }
        (d / "config.json").write_text(json.dumps(cfg))
        save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
        out.append(d)
    return out[0], out[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_next(tmp_path_factory.mktemp("q3n") / "model", seed=3)


def _logits(model_dir: Path, prompt: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    runner = SimpleRunner(load_model(model_dir, dtype=dtype))
    runner.add(0)
    return runner.extend({0: prompt}, all_logits=True).float()


PROMPT = [(7 * i + 3) % 250 for i in range(40)]


@pytest.mark.parametrize("block", [(16, 32), (128, 128)])
def test_fp8_blocks_load_as_their_dequantized_values(tiny: Path, tmp_path: Path, block: tuple[int, int]) -> None:
    fp8_dir, plain_dir = write_fp8_copy(tiny, tmp_path, block)
    stored = load_file(str(fp8_dir / "model.safetensors"))
    assert sum(t.dtype == torch.float8_e4m3fn for t in stored.values()) > 20  # experts, attention, DeltaNet
    fp8 = _logits(fp8_dir, PROMPT)
    assert torch.equal(fp8, _logits(plain_dir, PROMPT))  # exactly q * scale_inv, block by block
    # Near the unquantized model. e4m3 keeps 3 mantissa bits (2.6% weight error per block here), and this tiny
    # random model amplifies weight noise ~10x (bf16 weights alone: 4% logit error, 90% of argmaxes kept): measured
    # 31% / 42% relative logit error and 70% / 60% of the 40 argmaxes kept for blocks 16x32 / 128x128.
    ref = _logits(tiny, PROMPT)
    assert ((fp8 - ref).norm() / ref.norm()) < 0.5
    assert (fp8.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.55


def test_fp8_loads_into_bf16(tiny: Path, tmp_path: Path) -> None:
    fp8_dir, _ = write_fp8_copy(tiny, tmp_path, (16, 32))
    model = load_model(fp8_dir, dtype=torch.bfloat16)
    assert all(p.dtype in (torch.bfloat16, torch.float32) for p in model.parameters())
    ref = _logits(fp8_dir, PROMPT)  # the same checkpoint in fp32: only bf16's rounding apart (4% here)
    assert ((_logits(fp8_dir, PROMPT, torch.bfloat16) - ref).norm() / ref.norm()) < 0.1


def test_a_missing_scale_is_named(tiny: Path, tmp_path: Path) -> None:
    fp8_dir, _ = write_fp8_copy(tiny, tmp_path, (16, 32))
    tensors = load_file(str(fp8_dir / "model.safetensors"))
    victim = next(n for n in sorted(tensors) if n.endswith("_scale_inv"))
    del tensors[victim]
    save_file(tensors, str(fp8_dir / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=victim.replace(".", r"\.")):
        load_model(fp8_dir)


@pytest.mark.parametrize(
    "quant",
    [
        {"quant_method": "awq", "bits": 4},
        {"quant_method": "fp8", "activation_scheme": "static"},
        {"quant_method": "gptq"},
    ],
)
def test_other_quantizations_are_refused_naming_sglang(tiny: Path, tmp_path: Path, quant: dict[str, object]) -> None:
    d = tmp_path / "m"
    d.mkdir()
    cfg = json.loads((tiny / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": quant}))
    (d / "model.safetensors").write_bytes((tiny / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match="SGLang"):
        load_model(d)


def test_cuda_oom_while_loading_names_what_to_change() -> None:
    with pytest.raises(ModelLoadError) as err, weights_fit(torch.device("cuda:0")):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")
    message = str(err.value)
    assert "--mem-fraction-static" in message and "tensor parallelism (TP)" in message and "SGLang" in message
    assert "Tried to allocate 2.00 GiB" in message


def test_weights_larger_than_the_host_are_a_load_error(tiny: Path, tmp_path: Path) -> None:
    """A real allocation failure: an embedding of 2^44 x 64 fp32 rows (4 PiB) cannot be allocated."""
    d = tmp_path / "huge"
    d.mkdir()
    cfg = json.loads((tiny / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "vocab_size": 2**44}))
    (d / "model.safetensors").write_bytes((tiny / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match="out of memory on cpu while loading the weights"):
        load_model(d)
