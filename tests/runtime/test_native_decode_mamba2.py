"""The native decode step on Nemotron-H (runtime/native/hd_mamba2.h through runtime/engine/native_nemotron.py)
against the torch decode of the same model: logits, and every K/V row, conv window and SSM state the step writes.
Tiny random checkpoints (transformers' classes, weights perturbed so every norm and bias matters) through the
runtime's own loader: Mamba2 with 2 and 4 groups, conv kernels 4 (with bias) and 3 (without), in/out projection
biases, a dt floor that the softplus actually hits, attention without RoPE, squared-ReLU MLPs, Nemotron 3's MoE
blocks (group-limited sigmoid routing); batches in state slots of random order; fp32 and bf16 weights; 1 and 2
threads; the engine end to end with MoE blocks."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from runtime.core.batch import ForwardBatch
from runtime.core.requests import GenerateRequest
from runtime.engine.native_decode import MAMBA2_EXTEND_MAX_TOKENS, Unsupported, decode_weights, native_decode_for
from runtime.models import load_model
from runtime.models.base import HybridModel
from runtime.native.build import find_compiler
from tests.runtime.native_step_checks import (
    EXTEND_CASES,
    VOCAB,
    assert_bf16_bits,
    assert_extend_matches_torch,
    assert_extend_thread_bits,
    assert_generate_parity,
    assert_greedy_steps,
    assert_thread_bits,
)
from tests.runtime.native_step_checks import assert_same_step as _assert_same_step
from tests.runtime.native_step_checks import decode_batch as _decode_batch
from tests.runtime.native_step_checks import prefilled as _prefilled
from tests.runtime.test_engine_support import (
    _byte_level_tokenizer,
    greedy,
    make_core,
    one_torch_thread,
    perturb_weights,
    run_to_completion,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(find_compiler() is None, reason="needs a C compiler (CI installs gcc)")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _config(**kw: object) -> object:
    base: dict[str, object] = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, conv_kernel=4,
        expand=2, chunk_size=16, hybrid_override_pattern="M-M*M-", layers_block_type=None,
        max_position_embeddings=4096, eos_token_id=None,
    )  # fmt: skip
    base.update(kw)
    return transformers.NemotronHConfig(**base)


ARCHS: dict[str, Callable[[], object]] = {
    "groups2": lambda: _config(),
    # Four groups of heads of 8, state 12, a kernel-3 conv without bias (the general conv loop), projection biases,
    # and a dt floor of 0.3 that clamps part of the softplus outputs.
    "groups4_biased": lambda: _config(
        hybrid_override_pattern="M*-MM-",
        mamba_head_dim=8,
        ssm_state_size=12,
        n_groups=4,
        conv_kernel=3,
        use_conv_bias=False,
        use_bias=True,
        mamba_proj_bias=True,
        time_step_min=0.3,
    ),  # fmt: skip
    # Nemotron 3's MoE blocks: 8 relu² experts in 4 groups, the 2 best groups kept, top 3, a correction bias,
    # renormalized and scaled weights, a relu² shared expert.
    "moe_groups": lambda: _config(
        hybrid_override_pattern="ME*EM-E",
        n_routed_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
    ),  # fmt: skip
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    torch.manual_seed(0)
    hf = transformers.NemotronHForCausalLM(ARCHS[request.param]()).eval()
    perturb_weights(hf, 1)
    path: Path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return path, hf


@pytest.fixture(scope="module")
def model(checkpoint: tuple[Path, object]) -> HybridModel:
    return load_model(checkpoint[0])


def test_the_model_runs_natively_with_extends(model: HybridModel) -> None:
    native, status = native_decode_for(model, "auto", "cpu")
    assert native is not None and status.state == "on", status.detail
    assert status.detail.endswith("; short extends")
    weights = decode_weights(model)
    assert [lw.kind for lw in weights.layers].count(2) == weights.linear_layers > 0
    runner, nxt = _prefilled(model, [6])
    seq = runner.seqs[0]
    locs = list(range(runner.next_token_slot, runner.next_token_slot + 3))
    extend = ForwardBatch(
        mode="extend", input_ids=torch.tensor([1, 2, 3]), positions=torch.arange(6, 9), extend_lens=[3],
        prefix_lens=[6], kv_locs=[torch.tensor(seq.kv_locs + locs)], out_locs=torch.tensor(locs),
        state_slots=torch.tensor([seq.slot]),
    )  # fmt: skip
    assert native.handles(extend)  # one chain of rows in C
    longer = copy.copy(extend)
    longer.extend_lens = [MAMBA2_EXTEND_MAX_TOKENS[torch.float32] + 1]
    assert not native.handles(longer)  # torch's GEMMs win there (native_decode.py says by how much)
    assert native.handles(_decode_batch(runner, {0: nxt[0]}))


@pytest.mark.parametrize("lengths", [[1], [7], [40], [5, 33, 17], [9, 9, 64, 2, 30, 11, 4, 20]])
def test_decode_step_matches_torch(model: HybridModel, lengths: list[int]) -> None:
    runner, nxt = _prefilled(model, lengths, seed=len(lengths))
    _assert_same_step(model, runner, _decode_batch(runner, dict(enumerate(nxt))))


def test_greedy_decode_matches_torch_over_many_steps(model: HybridModel) -> None:
    """Twenty steps of four sequences (slots in random order): the native and the torch runner pick the same
    tokens, and their conv windows and states stay equal (each step's state feeds the next)."""
    assert_greedy_steps(model, [3, 21, 50, 8], seed=7, steps=20, pools=("conv", "ssm", "k"))


def test_greedy_native_decode_matches_transformers_generate(
    checkpoint: tuple[Path, object], model: HybridModel
) -> None:
    """Prefill through torch, then 40 native decode steps: the tokens transformers' fp32 generate picks."""
    assert_generate_parity(checkpoint[1], model, 40)


def test_bf16_weights_give_the_bits_of_fp32_weights_rounded_to_bf16(model: HybridModel) -> None:
    """Every parameter rounded to bf16, held as fp32 or as bf16 storage read in place: the same logits and pool
    rows, bit for bit, over greedy steps of a batch; and their tokens are the torch decode's on the rounded ones."""
    assert_bf16_bits(model, [4, 19, 44], seed=3, steps=8)


def test_two_threads_give_the_bits_of_one(model: HybridModel) -> None:
    assert_thread_bits(model, [5, 33, 17, 9], seed=11, steps=4)


def test_latent_moe_blocks_keep_the_torch_decode(model: HybridModel) -> None:
    moes = [block.mixer for block in model.body.layers if block.kind == "moe"]  # type: ignore[union-attr]
    if not moes:
        pytest.skip("no MoE blocks")
    decode_weights(model)  # natively decoded as it is
    moes[0].fc1_latent_proj = torch.nn.Linear(64, 32, bias=False)
    try:
        with pytest.raises(Unsupported, match=r"layer 1's experts run in a latent space \(moe_latent_size\)"):
            decode_weights(model)
    finally:
        moes[0].fc1_latent_proj = None


def test_moe_engine_greedy_tokens_identical_to_the_torch_decode(tmp_path: Path) -> None:
    """The engine with the native decode on and off over a Nemotron-H MoE model: the same greedy tokens, batched
    and alone, and the decode steps ran in C."""
    torch.manual_seed(0)
    cfg = ARCHS["moe_groups"]()
    cfg.vocab_size, cfg.eos_token_id, cfg.initializer_range = 256, 255, 0.2  # type: ignore[attr-defined]
    transformers.NemotronHForCausalLM(cfg).save_pretrained(tmp_path)
    _byte_level_tokenizer(tmp_path)
    native = make_core(tmp_path, chunked_prefill_size=7, mamba_track_interval=8)
    torch_core = make_core(tmp_path, chunked_prefill_size=7, mamba_track_interval=8, native_decode="off")
    assert native.runner.native_decode is not None and native.stats().native_decode.startswith("on")
    prompts = [[5, 6, 7, 8, 9], list(range(20, 47)), [3], list(range(100, 112)) * 2]
    for together in (True, False):
        reqs = [GenerateRequest(f"r{i}", p, greedy(8)) for i, p in enumerate(prompts)]
        before = native.runner.native_decode.steps
        want = run_to_completion(torch_core, reqs, together=together)
        got = run_to_completion(native, copy.deepcopy(reqs), together=together)
        for i in range(len(prompts)):
            assert got.tokens(f"r{i}") == want.tokens(f"r{i}"), f"prompt {i} diverged"
        assert native.runner.native_decode.steps - before >= 7


@pytest.mark.parametrize(("prefix", "new", "after", "all_logits"), EXTEND_CASES)
def test_extend_chain_matches_the_torch_extend(
    model: HybridModel, prefix: int, new: int, after: tuple[int, ...], all_logits: bool
) -> None:
    """One sequence's new tokens as one native chain (the Mamba2 conv and state advanced token by token): the
    torch extend's logits, K/V, states and state checkpoints."""
    assert_extend_matches_torch(model, prefix, new, after, all_logits=all_logits)


def test_extend_chain_on_two_threads_gives_the_bits_of_one(model: HybridModel) -> None:
    assert_extend_thread_bits(model, 30, 31)
