"""The demo model: deterministic bytes, no overwrite without --force, loads in our runtime and in HF."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime.demo_model import DemoModelError, build_demo_model, main
from runtime.models import load_model
from tests.runtime.conftest import REPO_ROOT
from tests.runtime.simple_runner import SimpleRunner


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    # These models are tiny: one intra-op thread is fastest, and it keeps a shared 2-core CI box responsive.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo") / "model")


def _digests(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_files_and_shape(demo: Path) -> None:
    names = {f.name for f in demo.iterdir()}
    assert names == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    }
    config = json.loads((demo / "config.json").read_text())
    assert config["model_type"] == "qwen3_next" and config["architectures"] == ["Qwen3NextForCausalLM"]
    assert config["max_position_embeddings"] >= 8192
    assert config["layer_types"].count("full_attention") * 3 == config["layer_types"].count("linear_attention")
    model = load_model(demo)
    params = sum(p.numel() for p in model.parameters())
    assert 8_000_000 <= params <= 14_000_000
    assert model.layout().vocab_size == config["vocab_size"]


def test_same_seed_same_bytes_other_seed_other_weights(demo: Path, tmp_path: Path) -> None:
    again = build_demo_model(tmp_path / "again", seed=0)
    assert _digests(again) == _digests(demo)
    other = build_demo_model(tmp_path / "other", seed=1)
    other_digests = _digests(other)
    assert other_digests["model.safetensors"] != _digests(demo)["model.safetensors"]
    assert other_digests["tokenizer.json"] == _digests(demo)["tokenizer.json"]


def test_refuses_to_overwrite_without_force(demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    build_demo_model(out)
    marker = out / "keep.txt"
    marker.write_text("mine")
    with pytest.raises(DemoModelError, match="--force"):
        build_demo_model(out)
    assert marker.read_text() == "mine"
    assert main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "Traceback" not in err
    assert main(["--out", str(out), "--force"]) == 0
    assert not marker.exists() and _digests(out) == _digests(demo)


def test_cli_module_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.demo_model", "--out", str(tmp_path / "cli")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "cli")
    assert (tmp_path / "cli" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "cli", [["-m", "runtime.demo_model"], [str(REPO_ROOT / "benchmarks" / "peers" / "peer_model.py")]], ids=str
)
def test_model_clis_refuse_an_existing_directory_without_a_traceback(tmp_path: Path, cli: list[str]) -> None:
    """Both model-building CLIs (the demo model and the peers benchmark's variant): exit 2 with the error line."""
    (tmp_path / "mine").write_text("mine")
    proc = subprocess.run(
        [sys.executable, *cli, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert proc.returncode == 2, proc.stderr
    assert "already exists and is not empty; pass --force" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert (tmp_path / "mine").read_text() == "mine"


def test_tokenizer_round_trip_and_chat_template(demo: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(demo)
    text = "The lighthouse keeper wrote in his notebook: wind north, strong."
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2  # the BPE learned real merges from the corpus
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|endoftext|>"
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 plus 2?"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\nWhat is 2 plus 2?<|im_end|>\n<|im_start|>assistant\n"


def test_transformers_loads_it_and_agrees_with_our_runtime(demo: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(demo, dtype=torch.float32).eval()
    prompt = list(range(40, 100, 3))
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False)[0, len(prompt) :]
    runner = SimpleRunner(load_model(demo))
    runner.add(0)
    ours = runner.extend({0: prompt}, all_logits=True)
    assert (ours - ref).abs().max().item() <= 1e-4
    # generate may stop early at the demo's EOS; compare what it produced.
    got = SimpleRunner(load_model(demo)).generate_greedy(0, prompt, len(expected))
    assert got == expected.tolist()


def test_missing_corpus_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.demo_model as demo_model

    monkeypatch.setattr(demo_model, "CORPUS", tmp_path / "nope.txt")
    with pytest.raises(DemoModelError, match="corpus"):
        build_demo_model(tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_unwritable_destinations_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert main(["--out", str(a_file)]) == 2
    assert main(["--out", str(a_file), "--force"]) == 2  # --force replaces directories, never a file
    assert main(["--out", str(a_file / "sub")]) == 2
    err = capsys.readouterr().err
    assert "is not a directory" in err and "cannot write the demo model" in err and "Traceback" not in err
    assert a_file.read_text() == "x"
