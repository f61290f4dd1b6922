"""The loader: HF names to our parameters, sharded checkpoints, extra (MTP) tensors, and clear errors."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.core.batch import ForwardBatch
from runtime.demo_model import build_demo_model
from runtime.models import ModelLoadError, load_model
from runtime.models.simple_runner import SimpleRunner


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    # These models are tiny: one intra-op thread is fastest, and it keeps a shared 2-core CI box responsive.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("loader") / "demo")


def _copy(demo_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(demo_dir, out)
    return out


def _logits(model_dir: Path, tokens: tuple[int, ...] | list[int] = (5, 17, 99, 3, 250, 1024)) -> torch.Tensor:
    runner = SimpleRunner(load_model(model_dir), num_token_slots=64, num_state_slots=2)
    runner.add(0)
    return runner.extend({0: list(tokens)}, all_logits=True)


def test_loads_every_parameter_from_the_checkpoint(demo_dir: Path) -> None:
    model = load_model(demo_dir)
    tensors = load_file(str(demo_dir / "model.safetensors"))
    params = dict(model.named_parameters())
    assert torch.equal(params["model.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
    # The fused DeltaNet projection is re-laid at load: its rows in [q | k | v | z] order (one gather, done once).
    qkvz_order, _ = model.model.layers[0].linear_attn._deinterleave_orders(torch.device("cpu"))
    assert torch.equal(
        params["model.layers.0.linear_attn.in_proj_qkvz.weight"],
        tensors["model.layers.0.linear_attn.in_proj_qkvz.weight"][qkvz_order],
    )
    # Per-expert tensors are stacked into one parameter: expert 5's gate then up rows.
    gate_up = params["model.layers.3.mlp.experts.gate_up_proj"][5]
    assert torch.equal(gate_up[:128], tensors["model.layers.3.mlp.experts.5.gate_proj.weight"])
    assert torch.equal(gate_up[128:], tensors["model.layers.3.mlp.experts.5.up_proj.weight"])
    assert torch.equal(
        params["model.layers.3.mlp.experts.down_proj"][7],
        tensors["model.layers.3.mlp.experts.7.down_proj.weight"],
    )
    assert not any(p.is_meta for p in params.values())
    config = json.loads((demo_dir / "config.json").read_text())
    gen = json.loads((demo_dir / "generation_config.json").read_text())
    assert config["eos_token_id"] in model.eos_token_ids
    assert set(gen["eos_token_id"]) <= set(model.eos_token_ids)


def test_sharded_checkpoint_loads_the_same_model(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    tensors = load_file(str(out / "model.safetensors"))
    (out / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(out / shard))
        weight_map.update(dict.fromkeys(shard_names, shard))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert torch.equal(_logits(out), _logits(demo_dir))


def test_mtp_tensors_are_kept_aside(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    tensors = load_file(str(out / "model.safetensors"))
    tensors["mtp.fc.weight"] = torch.ones(256, 512)
    save_file(tensors, str(out / "model.safetensors"))
    model = load_model(out)
    assert torch.equal(model.extra_weights["mtp.fc.weight"], torch.ones(256, 512))


def test_missing_tensor_is_named(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    tensors = load_file(str(out / "model.safetensors"))
    del tensors["model.layers.2.linear_attn.A_log"]
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.2\.linear_attn\.A_log.*model\.safetensors"):
        load_model(out)


def test_missing_expert_tensor_is_named(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    tensors = load_file(str(out / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.6.up_proj.weight"]
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.experts\.6\.up_proj\.weight"):
        load_model(out)


def test_unexpected_tensor_is_named_with_its_file(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    tensors = load_file(str(out / "model.safetensors"))
    tensors["model.layers.8.input_layernorm.weight"] = torch.zeros(256)
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ModelLoadError) as info:
        load_model(out)
    message = str(info.value)
    assert "model.layers.8.input_layernorm.weight" in message and str(out / "model.safetensors") in message


def test_wrong_shape_is_named(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    config = json.loads((out / "config.json").read_text())
    config["hidden_size"] = 128
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"has shape .* needs"):
        load_model(out)


def test_unsupported_model_type_says_what_is_supported(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    config = json.loads((out / "config.json").read_text())
    config["model_type"], config["architectures"] = "llama", ["LlamaForCausalLM"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"'llama'.*qwen3_next.*nemotron_h.*SGLang"):
        load_model(out)


def test_bad_config_json(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json: not found"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config\.json: not valid JSON"):
        load_model(tmp_path)


def test_missing_config_key_is_named(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    config = json.loads((out / "config.json").read_text())
    del config["linear_key_head_dim"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"config\.json: key 'linear_key_head_dim' is missing"):
        load_model(out)


def test_scaled_rope_is_refused_not_ignored(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    config = json.loads((out / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"rope type 'yarn'"):
        load_model(out)


def test_bfloat16_load(demo_dir: Path) -> None:
    model = load_model(demo_dir, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    runner = SimpleRunner(model, num_token_slots=64, num_state_slots=2)
    runner.add(0)
    logits = runner.extend({0: [5, 17, 99]})
    assert logits.dtype == torch.float32 and logits.shape == (1, 4096)
    reference = _logits(demo_dir, [5, 17, 99])[-1]
    # bf16 through 8 random layers drifts a little; a broken bf16 path gives a similarity near 0.
    assert torch.nn.functional.cosine_similarity(logits[0], reference, dim=0) > 0.97


def test_forward_batch_is_not_mutated(demo_dir: Path) -> None:
    model = load_model(demo_dir)
    runner = SimpleRunner(model, num_token_slots=32, num_state_slots=2)
    batch = ForwardBatch(
        mode="extend",
        input_ids=torch.tensor([1, 2, 3]),
        positions=torch.tensor([0, 1, 2]),
        extend_lens=[3],
        prefix_lens=[0],
        kv_locs=[torch.tensor([4, 9, 2])],
        out_locs=torch.tensor([4, 9, 2]),
        state_slots=torch.tensor([1]),
    )
    model(batch, runner.buffers)
    assert batch.kv_locs[0].tolist() == [4, 9, 2] and batch.state_slots.tolist() == [1]
    # K/V went exactly to the slots asked for, nowhere else.
    written = runner.buffers.k[0].abs().sum(dim=(1, 2)) > 0
    assert sorted(torch.nonzero(written).flatten().tolist()) == [2, 4, 9]
    # State went to slot 1 only.
    assert runner.buffers.ssm[0][1].abs().sum() > 0 and runner.buffers.ssm[0][0].abs().sum() == 0


def test_qwen3_5_multimodal_checkpoint_loads_its_language_model(tmp_path: Path) -> None:
    """A Qwen3.5 image-text checkpoint nests the language model under `model.language_model.` beside a vision
    tower. The runtime loads the language model, skips the tower, and matches transformers."""
    transformers = pytest.importorskip("transformers")
    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
    }
    text = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "rope_parameters": rope,
    }
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    cfg = transformers.Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        image_token_id=120,
        video_token_id=121,
        vision_start_token_id=122,
        vision_end_token_id=123,
    )
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path)
    assert not any("visual" in name for name, _ in model.named_parameters())
    prompt = torch.randint(0, 120, (50,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([prompt])).logits[0]
    runner = SimpleRunner(model, num_token_slots=64, num_state_slots=2)
    runner.add(0)
    assert (runner.extend({0: prompt}, all_logits=True) - ref).abs().max().item() <= 1e-4


def test_truncated_safetensors_is_named(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    data = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors"):
        load_model(out)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_inconsistent_config_numbers_are_a_load_error(demo_dir: Path, tmp_path: Path) -> None:
    out = _copy(demo_dir, tmp_path)
    config = json.loads((out / "config.json").read_text())
    config["linear_num_value_heads"] = 0  # heads that do not divide
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_model(out)
