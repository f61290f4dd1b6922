"""Helpers (no tests) for the engine/scheduler tests: tiny real checkpoints and in-process engines.

Models are built with transformers' own classes (random init, fixed seed) and saved as real safetensors; the
runtime loads them through its normal loader. A byte-level tokenizer.json makes stop strings testable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
from runtime.engine.engine_core import EngineCore

VOCAB = 256


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core machine: intra-op threads only fight each other (20x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _byte_level_tokenizer(out: Path) -> None:
    """tokenizer.json with one token per byte (ids 0..255): any text round-trips, no training needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(out / "tokenizer.json"))


def _bytes_to_unicode() -> dict[int, str]:
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def build_tiny_qwen3_next(out: Path, seed: int = 0) -> Path:
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=2,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        max_position_embeddings=4096, eos_token_id=VOCAB - 1, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(seed)
    Qwen3NextForCausalLM(cfg).save_pretrained(out)
    _byte_level_tokenizer(out)
    return out


def build_tiny_nemotron_h(out: Path, seed: int = 0) -> Path:
    from transformers import NemotronHConfig, NemotronHForCausalLM

    cfg = NemotronHConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, conv_kernel=4,
        expand=2, chunk_size=16, hybrid_override_pattern="M*M-", layers_block_type=None,
        max_position_embeddings=4096, eos_token_id=VOCAB - 1, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(seed)
    NemotronHForCausalLM(cfg).save_pretrained(out)
    _byte_level_tokenizer(out)
    return out


# The two families every engine-level property runs on (one Gated DeltaNet hybrid, one Mamba2 hybrid).
TINY_BUILDERS = {"qwen3_next": build_tiny_qwen3_next, "nemotron_h": build_tiny_nemotron_h}
FAMILIES = list(TINY_BUILDERS)


def make_core(model_dir: Path, **overrides: object) -> EngineCore:
    """An engine with small pools (check_invariants walks every page and slot, every step)."""
    kw: dict[str, object] = {"memory_budget_gib": 0.05, "max_total_tokens": 4096, "max_mamba_cache_size": 96}
    kw.update(overrides)
    return EngineCore(EngineArgs(model_path=str(model_dir), **kw))  # type: ignore[arg-type]


@dataclass
class Collected:
    outputs: dict[str, list[RequestOutput]] = field(default_factory=dict)

    def callback(self) -> Callable[[RequestOutput], None]:
        def on_output(o: RequestOutput) -> None:
            self.outputs.setdefault(o.rid, []).append(o)

        return on_output

    def tokens(self, rid: str) -> list[int]:
        return [t for o in self.outputs[rid] for t in o.new_token_ids]

    def final(self, rid: str) -> RequestOutput:
        last = self.outputs[rid][-1]
        assert last.finished
        return last


def greedy(max_new_tokens: int = 6, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True, **kw)  # type: ignore[arg-type]


def run_to_completion(
    core: EngineCore,
    reqs: list[GenerateRequest],
    *,
    together: bool,
    check: bool = True,
    max_steps: int = 100_000,
) -> Collected:
    """Run requests (all queued at once, or one after another) until done; check the invariants each step."""
    got = Collected()
    batches = [reqs] if together else [[r] for r in reqs]
    for batch in batches:
        for r in batch:
            core.scheduler.add_request(r, got.callback())
        steps = 0
        while core.scheduler.has_work:
            core.step()
            steps += 1
            assert steps < max_steps, "the engine made no progress"
            if check:
                core.scheduler.check_invariants()
    return got


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data))


def perturb_weights(model: torch.nn.Module, seed: int) -> None:
    """HF init leaves norms at identity and biases constant; randomize everything so every weight matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name or leaf in ("dt_bias", "D", "bias", "e_score_correction_bias"):
                p.add_(0.2 * noise)
            else:
                p.mul_(1.0 + 0.5 * noise.abs())
