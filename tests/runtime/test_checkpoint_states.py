"""Model level: the states an extend forward writes at its checkpoints (ForwardBatch.state_checkpoints) equal the
states left by prefilling exactly that many tokens, for the three recurrent kernels (Qwen3-Next's delta rule,
Mamba2's SSD scan, Kimi's KDA), at chunk boundaries and inside chunks, alone and in a padded batch, and from a
cached prefix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime.core.batch import ForwardBatch, PoolBuffers
from runtime.core.buffers import allocate_pool_buffers
from runtime.models.base import HybridModel
from runtime.models.layers import packing
from runtime.models.layers.state_checkpoints import supports_state_checkpoints
from runtime.models.loader import load_model
from tests.runtime.test_engine_support import VOCAB, build_tiny_nemotron_h, build_tiny_qwen3_next, one_torch_thread

# A checkpoint on a kernel chunk boundary is bit-identical to prefilling that many tokens. Inside a chunk the
# reference prefill pads the chunk with zeros while the checkpoint sums only the real tokens: the same terms, in
# another order, so earlier layers' outputs differ in the last fp32 bits and later layers see that noise.
TOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def build_tiny_kimi_linear(out: Path, seed: int = 0) -> Path:
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    cfg = KimiLinearConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, linear_num_heads=4, linear_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, n_group=2,
        topk_group=1, pad_token_id=None, bos_token_id=None, eos_token_id=VOCAB - 1,
    )  # fmt: skip
    torch.manual_seed(seed)
    KimiLinearForCausalLM(cfg).save_pretrained(out)
    return out


BUILDERS = {
    "qwen3_next": build_tiny_qwen3_next,
    "nemotron_h": build_tiny_nemotron_h,
    "kimi_linear": build_tiny_kimi_linear,
}
# Tokens per chunk of each family's chunked kernel in these tiny models: checkpoints there are bit-exact.
GRID = {"qwen3_next": 64, "nemotron_h": 16, "kimi_linear": 64}


@pytest.fixture(scope="module", params=list(BUILDERS))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def model(family: str, tmp_path_factory: pytest.TempPathFactory) -> HybridModel:
    model_dir = BUILDERS[family](Path(tmp_path_factory.mktemp(family)) / "model")
    return load_model(str(model_dir), dtype=torch.float32)


def _buffers(model: HybridModel) -> PoolBuffers:
    return allocate_pool_buffers(model.layout(), num_token_slots=4096, num_state_slots=64)


def _extend(
    model: HybridModel,
    buffers: PoolBuffers,
    seqs: list[tuple[list[int], int, int, int]],
    checkpoints: list[list[tuple[int, int]]] | None = None,
) -> torch.Tensor:
    """seqs: (all tokens, prefix_len, state slot, KV base offset). Runs one extend forward over all of them."""
    ids: list[int] = []
    positions: list[int] = []
    out_locs: list[int] = []
    kv_locs: list[torch.Tensor] = []
    for tokens, prefix, _, base in seqs:
        ids.extend(tokens[prefix:])
        positions.extend(range(prefix, len(tokens)))
        out_locs.extend(range(base + prefix, base + len(tokens)))
        kv_locs.append(torch.arange(base, base + len(tokens)))
    batch = ForwardBatch(
        mode="extend",
        input_ids=torch.tensor(ids),
        positions=torch.tensor(positions),
        extend_lens=[len(t) - p for t, p, _, _ in seqs],
        prefix_lens=[p for _, p, _, _ in seqs],
        kv_locs=kv_locs,
        out_locs=torch.tensor(out_locs),
        state_slots=torch.tensor([s for _, _, s, _ in seqs]),
        state_checkpoints=checkpoints,
    )
    with torch.inference_mode():
        return model.forward(batch, buffers)


def _max_diff(buffers: PoolBuffers, slot_a: int, slot_b: int) -> float:
    """Largest difference over all layers' conv and SSM state, relative to the state's magnitude (>= 1)."""
    diffs = [
        (t[slot_a] - t[slot_b]).abs().max().item() / max(1.0, t[slot_b].abs().max().item())
        for t in (*buffers.conv, *buffers.ssm)
    ]
    return max(diffs)


def _tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB - 1, (n,), generator=g).tolist()


def test_both_families_write_checkpoints(model: HybridModel) -> None:
    assert supports_state_checkpoints(model)


def test_checkpoint_states_equal_prefilling_that_many_tokens(
    model: HybridModel, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bit-exactness on the grid is the chunked kernels' property: the short reference prefills would
    # otherwise take the short-extend C kernels (token by token, within TOL: tests/runtime/test_short_extend_
    # kernels.py), so the short-extend path is off here.
    monkeypatch.setattr(packing, "SHORT_EXTEND_MAX_TOKENS", 0)
    buffers = _buffers(model)
    prompt = _tokens(150, seed=1)
    # Chunk boundaries of both families (16 / 64), inside chunks, the first token, and the very end.
    counts = [1, 5, 16, 37, 64, 100, 128, 149, 150]
    _extend(model, buffers, [(prompt, 0, 1, 0)], [[(n, 10 + i) for i, n in enumerate(counts)]])
    grid = GRID[family]
    for i, n in enumerate(counts):
        _extend(model, buffers, [(prompt[:n], 0, 2, 1000)])
        assert _max_diff(buffers, 10 + i, 2) <= TOL, f"checkpoint after {n} tokens"
        if n % grid == 0:
            assert _max_diff(buffers, 10 + i, 2) == 0.0, f"checkpoint after {n} tokens is on the chunk grid"
    assert _max_diff(buffers, 10 + counts.index(150), 1) <= TOL  # the checkpoint at the end is the final state


def test_checkpoints_in_a_padded_batch_from_a_cached_prefix(model: HybridModel) -> None:
    """Two sequences of different lengths in one forward; the second continues a cached state (prefix 40)."""
    buffers = _buffers(model)
    a, b = _tokens(90, seed=2), _tokens(130, seed=3)
    _extend(model, buffers, [(b[:40], 0, 3, 2000)])  # b's first 40 tokens: KV at 2000.., state in slot 3
    _extend(model, buffers, [(a, 0, 1, 0), (b, 40, 3, 2000)], [[(30, 20), (90, 21)], [(24, 22), (77, 23)]])
    for slot, tokens, n in [(20, a, 30), (21, a, 90), (22, b, 64), (23, b, 117)]:
        _extend(model, buffers, [(tokens[:n], 0, 2, 3000)])
        assert _max_diff(buffers, slot, 2) <= TOL, f"checkpoint after {n} tokens"


def test_checkpoints_do_not_change_the_logits(model: HybridModel) -> None:
    buffers = _buffers(model)
    prompt = _tokens(100, seed=4)
    plain = _extend(model, buffers, [(prompt, 0, 1, 0)])
    with_checkpoints = _extend(model, buffers, [(prompt, 0, 2, 1000)], [[(33, 5), (64, 6)]])
    assert torch.equal(plain, with_checkpoints)


def test_a_checkpoint_past_the_extend_is_refused(model: HybridModel) -> None:
    buffers = _buffers(model)
    with pytest.raises(ValueError, match="state checkpoint after 11 new tokens"):
        _extend(model, buffers, [(_tokens(10, seed=5), 0, 1, 0)], [[(11, 5)]])


@pytest.mark.parametrize("traced", [False, True])
def test_kernels_alone_match_within_1e6(traced: bool) -> None:
    """The three chunked kernels on identical inputs: a checkpoint anywhere equals the truncated run's state,
    with Python token counts and with traced ones (a tensor, what a compiled extend passes; every count then
    goes through the inside-a-chunk formula, chunk ends included)."""
    from runtime.models.layers.delta_rule import chunk_gated_delta_rule, l2norm
    from runtime.models.layers.ssd import chunk_scan
    from runtime.models.layers.state_checkpoints import StateCheckpoints

    g = torch.Generator().manual_seed(0)
    length, heads, dim = 150, 2, 8
    counts = [1, 7, 64, 90, 128, 150]
    if traced:
        cps = StateCheckpoints.traced(torch.tensor(counts), torch.arange(len(counts)))
    else:
        cps = StateCheckpoints([0] * len(counts), counts, torch.arange(len(counts)))

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    q, k = l2norm(rnd(1, length, heads, dim)), l2norm(rnd(1, length, heads, dim))
    v, gate, beta = rnd(1, length, heads, dim), -rnd(1, length, heads).abs() * 0.1, rnd(1, length, heads).sigmoid()
    init = rnd(1, heads, dim, dim)
    got: list[torch.Tensor] = []
    chunk_gated_delta_rule(q, k, v, gate, beta, init, checkpoints=cps, captured=got)
    for n, state in zip(counts, got, strict=True):
        _, want = chunk_gated_delta_rule(q[:, :n], k[:, :n], v[:, :n], gate[:, :n], beta[:, :n], init)
        assert (state - want[0]).abs().max().item() <= 1e-6, f"delta rule after {n}"

    from runtime.models.layers.kda import chunk_kda

    channel_gate = -rnd(1, length, heads, dim).abs() * 0.1
    got = []
    chunk_kda(q, k, v, channel_gate, beta, init, checkpoints=cps, captured=got)
    for n, state in zip(counts, got, strict=True):
        _, want = chunk_kda(q[:, :n], k[:, :n], v[:, :n], channel_gate[:, :n], beta[:, :n], init)
        assert (state - want[0]).abs().max().item() <= 1e-6, f"KDA after {n}"

    x, dt, b, c = (
        rnd(1, length, heads, dim),
        rnd(1, length, heads).abs() * 0.1,
        rnd(1, length, 1, 4),
        rnd(1, length, 1, 4),
    )
    a, d, init = -torch.ones(heads), torch.ones(heads), rnd(1, heads, dim, 4)
    got = []
    chunk_scan(x, dt, a, b, c, d, init, 16, checkpoints=cps, captured=got)
    for n, state in zip(counts, got, strict=True):
        _, want = chunk_scan(x[:, :n], dt[:, :n], a, b[:, :n], c[:, :n], d, init, 16)
        assert (state - want[0]).abs().max().item() <= 1e-6, f"SSD scan after {n}"


def test_conv_window_rows_are_slices_of_old_window_then_inputs() -> None:
    """A checkpoint's conv window (and a sequence's new window) is the K-1 rows after n inputs of the old window
    followed by the new inputs, for n inside the old window, across it and past it, per sequence of a batch."""
    from runtime.models.layers.conv import window_rows

    g = torch.Generator().manual_seed(1)
    old, inputs = torch.randn(2, 3, 5, generator=g), torch.randn(2, 70, 5, generator=g).bfloat16()
    seqs, counts = torch.tensor([0, 0, 1, 1, 0, 1]), torch.tensor([0, 1, 2, 7, 33, 70])
    got = window_rows(old, inputs, seqs, counts)
    for m, (b, n) in enumerate(zip(seqs.tolist(), counts.tolist(), strict=True)):
        assert torch.equal(got[m], torch.cat([old[b], inputs[b].float()])[n : n + 3])
