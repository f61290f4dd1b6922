"""Weights in the checkpoint's dtype: `--dtype auto` keeps a bf16 checkpoint in bf16 on CPU (half the weight
bytes, the planner's numbers, the torch decode path), and every family's bf16 forward agrees with transformers'
bf16 reference, through prefill, decode, the prefix cache, chunked prefill, batching and speculative decoding.

bf16 logits are bf16-rounded (lm_head runs in bf16, as in transformers and SGLang), so on these tiny random models
two tokens often have exactly the same logit: one rounding apart, either engine may pick either. Agreement is
therefore counted position by position on transformers' own greedy sequence (each position's argmax given the
same history), and every disagreement, and every point where two greedy runs part, must be such a near-tie:
the reference's two candidates at most one bf16 ulp apart."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest
from runtime.engine.engine_core import EngineCore
from runtime.engine.native_decode import native_reads
from runtime.models import load_model
from runtime.models.base import HybridModel
from tests.runtime.simple_runner import SimpleRunner
from tests.runtime.test_engine_support import greedy, make_core, perturb_weights, run_to_completion
from tests.runtime.test_model_reference import ARCHS, _prompt
from tests.runtime.test_native_decode import _qwen3_5_dense

# Every registered family: test_model_reference's models and the dense Qwen3.5 variant.
BUILDERS = {name: build for name, (build, _) in ARCHS.items()} | {"qwen3_5_dense": _qwen3_5_dense}

REPO = Path(__file__).resolve().parents[2]
NEW_TOKENS = 128


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared 2-core box
    yield
    torch.set_num_threads(before)


def _reference(arch: str) -> Any:  # a transformers PreTrainedModel (save_pretrained, generate)
    """transformers' model of `arch` with randomized weights (the same draw as test_model_reference), in bf16."""
    torch.manual_seed(0)
    hf = BUILDERS[arch]().eval()
    perturb_weights(hf, 1)
    return hf.to(torch.bfloat16)


@pytest.fixture(scope="module")
def qwen_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One Qwen3-Next model saved twice: in bf16 and in fp32 (the bf16 values, widened)."""
    hf = _reference("qwen3_next")
    root = tmp_path_factory.mktemp("qwen_dtypes")
    hf.save_pretrained(root / "bf16")
    hf.float().save_pretrained(root / "fp32")
    return {"bf16": root / "bf16", "fp32": root / "fp32"}


def _core(path: Path, **kw: object) -> EngineCore:
    return EngineCore(EngineArgs(model_path=str(path), memory_budget_gib=0.05, max_total_tokens=4096, **kw))  # type: ignore[arg-type]


def test_auto_keeps_a_bf16_checkpoint_in_bf16(
    qwen_checkpoints: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="runtime.engine"):
        auto = _core(qwen_checkpoints["bf16"])
    assert auto.dtype == torch.bfloat16 and auto.model.weight_dtype == torch.bfloat16
    assert "dtype=torch.bfloat16" in next(r.getMessage() for r in caplog.records if "Load weight end" in r.getMessage())
    # On CPU the KV cache and the conv window stay fp32 (pool_dtype) beside the bf16 weights, as the native step
    # reads them; the recurrent state stays fp32.
    buffers = auto.pools.buffers
    assert {t.dtype for t in (*buffers.k, *buffers.v, *buffers.conv)} == {torch.float32}
    assert {t.dtype for t in buffers.ssm} == {torch.float32}
    # The C decode step reads the bf16 weights in place.
    assert native_reads(torch.bfloat16) and auto.runner.native_decode is not None
    forced = _core(qwen_checkpoints["bf16"], dtype="float32")
    assert forced.dtype == torch.float32 and forced.model.weight_dtype == torch.float32
    # Half the bytes, but for the few small parameters kept in fp32 under 16-bit weights (HybridModel.cast).
    kept = sum(p.numel() for p in auto.model.parameters() if p.dtype == torch.float32)
    assert kept < auto.weight_bytes / 100
    assert auto.weight_bytes == (forced.weight_bytes - 4 * kept) // 2 + 4 * kept
    # An fp32 checkpoint stays fp32.
    assert _core(qwen_checkpoints["fp32"]).dtype == torch.float32


def test_plan_sizes_a_bf16_checkpoint_as_the_runtime_does(qwen_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model = qwen_checkpoints["bf16"]
    (tmp_path / "config.toml").write_text(
        f'[server]\nengine = "builtin"\nmodel_path = "{model}"\n[memory]\nmemory_budget_gib = 0.25\n'
    )
    run = subprocess.run(
        [sys.executable, "-m", "hybridctl", "plan", "--json"], cwd=tmp_path, capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)
    core = EngineCore(EngineArgs(model_path=str(model), memory_budget_gib=0.25))
    assert plan["kv_dtype"] == "float32"  # on CPU the pools stay fp32 beside bf16 weights (pool_dtype)
    assert plan["kv_dtype"] == str(core.pools.buffers.k[0].dtype).removeprefix("torch.")
    # The checkpoint's bytes; the runtime holds the few fp32-kept parameters (HybridModel.cast) at 4 bytes.
    assert 0 <= core.weight_bytes - plan["weights_bytes"] < core.weight_bytes / 100
    assert plan["max_total_num_tokens"] == core.pools.plan.max_total_num_tokens
    assert plan["max_running_requests"] == core.pools.plan.max_running_requests


def _ulp(value: float) -> float:
    """One bf16 ulp at `value`: 8 significant bits."""
    return 2.0 ** (math.floor(math.log2(max(abs(value), 1e-30))) - 7)


def _near_tie(logits: torch.Tensor, a: int, b: int) -> bool:
    """Tokens a and b within one bf16 ulp of each other in `logits` (bf16 values widened to fp32)."""
    hi = max(float(logits[a]), float(logits[b]))
    return abs(float(logits[a]) - float(logits[b])) <= _ulp(hi)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_bf16_greedy_agrees_with_transformers_bf16(arch: str, tmp_path: Path) -> None:
    hf = _reference(arch)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, dtype=torch.bfloat16)
    prompt = _prompt(40, 1)
    with torch.no_grad():
        seq = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)[0]
        ref = hf(seq[None]).logits[0, len(prompt) - 1 : -1].float()  # the logits each greedy token was picked from
    expected = seq[len(prompt) :].tolist()
    assert len(expected) == NEW_TOKENS
    # Prefill of the whole sequence, and decode token by token over transformers' history.
    prefill = _bf16_runner(model)
    prefill.add(0)
    prefilled = prefill.extend({0: seq.tolist()}, all_logits=True)[len(prompt) - 1 : -1]
    decode = _bf16_runner(model)
    decode.add(0)
    decoded = [decode.extend({0: prompt})[-1]]
    for token in expected[:-1]:
        decoded.append(decode.extend({0: [token]})[-1])
    for ours in (prefilled, torch.stack(decoded)):
        picks = ours.argmax(-1).tolist()
        agree = sum(p == e for p, e in zip(picks, expected, strict=True))
        assert agree >= 0.95 * NEW_TOKENS, f"{arch}: {agree}/{NEW_TOKENS} positions agree"
        ties = [_near_tie(ref[i], p, e) for i, (p, e) in enumerate(zip(picks, expected, strict=True)) if p != e]
        assert all(ties), f"{arch}: a disagreement that is no near-tie of transformers' logits"
    # Free-running greedy: identical up to the first near-tie, where the two runs may part.
    ours_free = _bf16_runner(model).generate_greedy(0, prompt, NEW_TOKENS)
    first = next((i for i, (a, b) in enumerate(zip(ours_free, expected, strict=True)) if a != b), None)
    if first is not None:
        assert _near_tie(ref[first], ours_free[first], expected[first]), f"{arch}: parted at {first}, no near-tie"


def _bf16_runner(model: HybridModel) -> SimpleRunner:
    return SimpleRunner(model, kv_dtype=torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_bf16_engine_paths_agree(arch: str, tmp_path: Path) -> None:
    """Prefix cache (checkpoints inside chunks), chunked prefill, batching and speculative decoding (NGRAM and a
    self-draft) on a bf16 checkpoint: every request completes, and its greedy tokens equal the plain engine's
    (no cache, whole prompts, one at a time) or part from them only at a near-tie of the plain model's logits."""
    hf = _reference(arch)
    hf.save_pretrained(tmp_path)
    prefixes = [_prompt(40, 10), _prompt(40, 11)]
    prompts = [prefixes[i % 2] + _prompt(3 + 5 * i, 20 + i) for i in range(5)]

    def reqs() -> list[GenerateRequest]:
        return [GenerateRequest(f"r{i}", p, greedy(24)) for i, p in enumerate(prompts)]

    plain_core = make_core(tmp_path, disable_radix_cache=True, chunked_prefill_size=-1)
    plain = run_to_completion(plain_core, reqs(), together=False)
    expected = {f"r{i}": plain.tokens(f"r{i}") for i in range(len(prompts))}
    spec = {"speculative_num_steps": 3}
    variants = {
        "cache_chunked": make_core(tmp_path, chunked_prefill_size=7, mamba_track_interval=8),
        "ngram": make_core(tmp_path, speculative_algorithm="NGRAM", chunked_prefill_size=7, **spec),
        "self_draft": make_core(
            tmp_path, speculative_algorithm="STANDALONE", speculative_draft_model_path=str(tmp_path),
            chunked_prefill_size=7, **spec,
        ),
    }  # fmt: skip
    model = load_model(tmp_path, dtype=torch.bfloat16)
    # The native decode step computes in fp32 on the bf16 weights (bit for bit the fp32 step on those weights, which
    # this copy holds); the torch path computes in bf16 (prefill, spec verify rounds).
    model_fp32 = load_model(tmp_path, dtype=torch.bfloat16).float()
    for name, core in variants.items():
        assert core.dtype == torch.bfloat16
        for together in (False, True):
            got = run_to_completion(core, reqs(), together=together)
            for i, prompt in enumerate(prompts):
                rid = f"r{i}"
                tokens, want = got.tokens(rid), expected[rid]
                assert len(tokens) == len(want) == 24
                first = next((j for j, (a, b) in enumerate(zip(tokens, want, strict=True)) if a != b), None)
                if first is None:
                    continue
                history = prompt + want[:first]
                a, b = tokens[first], want[first]
                paths = []
                for runner in (_bf16_runner(model), SimpleRunner(model_fp32)):
                    runner.add(0)
                    paths.append(runner.extend({0: history})[-1])
                # A parting at a near-tie: the two tokens' margin is within one bf16 ulp, or within what the two
                # paths' precisions move these two logits apart (a request's history may mix both paths).
                gap = max(abs(float(paths[0][t]) - float(paths[1][t])) for t in (a, b))
                margin = min(abs(float(logits[a]) - float(logits[b])) for logits in paths)
                tie = any(_near_tie(logits, a, b) for logits in paths) or margin <= 2 * gap
                assert tie, f"{arch} {name}: {rid} parted at {first} (margin {margin:.4f}, paths' gap {gap:.4f})"


_RESIDENT_PROBE = """
import json, re, sys
import runtime  # the server's malloc settings (runtime/__init__.py)
import torch
from runtime.models import load_model


def anon_mib():
    return int(re.search(r"RssAnon:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024


before = anon_mib()
model = load_model(sys.argv[1], dtype=getattr(torch, sys.argv[2]))
weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
print(json.dumps({"grew": anon_mib() - before, "weights": weights}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_resident_memory_follows_the_weights(tmp_path: Path) -> None:
    """Loading holds the weights once, in their dtype: no fp32 copy, no stacked-expert temporaries left resident
    (a MoE model of ~70 MB in bf16; what the load leaves beyond the weights is a few MiB)."""
    from benchmarks.peers.peer_model import build_real_model

    model = build_real_model(tmp_path / "model", layers=4, hidden=512, experts=8, vocab=8000, expert_intermediate=512)
    grown = {}
    for dtype in ("bfloat16", "float32"):
        run = subprocess.run(
            [sys.executable, "-c", _RESIDENT_PROBE, str(model), dtype], capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        grown[dtype] = json.loads(run.stdout.splitlines()[-1])
    assert grown["float32"]["weights"] > 1.95 * grown["bfloat16"]["weights"] > 100
    for dtype, mib in grown.items():
        assert mib["grew"] <= mib["weights"] + 24, f"{dtype}: {mib}"
