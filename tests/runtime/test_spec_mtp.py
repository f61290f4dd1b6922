"""NEXTN drafting from a Qwen3-Next checkpoint's MTP layer: every draft the engine proposes (after prefill
chunks, verify rounds and prefix-cache hits) equals the MTP head recomputed from scratch over the whole
sequence, and greedy output stays identical to plain decoding."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.core.batch import ForwardBatch, PoolBuffers
from runtime.core.buffers import allocate_pool_buffers
from runtime.core.requests import GenerateRequest
from runtime.engine.engine_core import EngineCore
from runtime.speculative.mtp import MtpDrafter
from tests.runtime.test_engine_support import build_tiny_qwen3_next, greedy, make_core, one_torch_thread
from tests.runtime.test_engine_support import run_to_completion as run

STEPS = 3


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def with_mtp_weights(src: Path, dst: Path) -> Path:
    """A copy of the checkpoint plus mtp.* tensors shaped as Qwen3-Next's: the MTP decoder layer starts from
    the target's full-attention layer 1, the fc mixing matrix is random."""
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    generator = torch.Generator().manual_seed(3)
    for name in [n for n in tensors if n.startswith("model.layers.1.")]:
        tensors["mtp.layers.0." + name.removeprefix("model.layers.1.")] = tensors[name].clone()
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    tensors["mtp.fc.weight"] = 0.2 * torch.randn(hidden, 2 * hidden, generator=generator)
    for name in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        tensors[name] = 0.1 * torch.randn(hidden, generator=generator)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(tmp_path_factory.mktemp("mtp"))
    return with_mtp_weights(build_tiny_qwen3_next(root / "plain"), root / "with_mtp")


def reference_drafts(core: EngineCore, tokens: list[int], k: int) -> list[int]:
    """Target over tokens[:-1] in one extend on fresh buffers, then the MTP over every position at once and
    k - 1 chained steps: no cache, no chunks, no reuse."""
    drafter = core.spec.drafter  # type: ignore[union-attr]
    assert isinstance(drafter, MtpDrafter)
    model, mtp = core.model, drafter.mtp
    n = len(tokens) - 1
    layout = model.layout()
    buffers = allocate_pool_buffers(layout, n + k, 1)
    captured: list[torch.Tensor] = []
    hook = model.model.layers[-1].register_forward_hook(lambda _m, _a, out: captured.append(out))

    def extend(ids: list[int], start: int, bufs: PoolBuffers, total: int, **kw: object) -> ForwardBatch:
        return ForwardBatch(
            mode="extend" if len(ids) > 1 or start == 0 else "decode",
            input_ids=torch.tensor(ids),
            positions=torch.arange(start, start + len(ids)),
            extend_lens=[len(ids)],
            prefix_lens=[start],
            kv_locs=[torch.arange(total)],
            out_locs=torch.arange(start, start + len(ids)),
            state_slots=torch.tensor([0]),
            **kw,  # type: ignore[arg-type]
        )

    try:
        with torch.inference_mode():
            model.forward(extend(tokens[:n], 0, buffers, n), buffers)
            hidden = model.model.norm(captured[-1])
            mtp_bufs = PoolBuffers(
                k=[torch.zeros(n + k, layout.num_kv_heads, layout.head_dim)],
                v=[torch.zeros(n + k, layout.num_kv_heads, layout.v_head_dim)],
                conv=[],
                ssm=[],
            )
            logits, out = mtp(extend(tokens[1:], 0, mtp_bufs, n, all_logits=True), mtp_bufs, hidden)
            drafts = [int(logits[-1].argmax())]
            h = out[-1:]
            for step in range(k - 1):
                pos = n + step
                logits, h = mtp(extend([drafts[-1]], pos, mtp_bufs, pos + 1), mtp_bufs, h)
                drafts.append(int(logits[-1].argmax()))
    finally:
        hook.remove()
    return drafts


def test_engine_drafts_equal_a_from_scratch_mtp_and_output_is_exact(model_dir: Path) -> None:
    plain = make_core(model_dir, disable_radix_cache=True, chunked_prefill_size=-1)
    core = make_core(
        model_dir, speculative_algorithm="NEXTN", speculative_num_steps=STEPS, chunked_prefill_size=7,
        mamba_track_interval=8, max_total_tokens=256, max_mamba_cache_size=12,
    )  # fmt: skip
    assert core.spec is not None and isinstance(core.spec.drafter, MtpDrafter)
    drafter = core.spec.drafter
    proposals: list[tuple[list[int], list[int]]] = []
    original = drafter.propose

    def recording(reqs: list) -> list[list[int]]:
        drafts = original(reqs)
        proposals.extend((list(r.all_ids), list(d)) for r, d in zip(reqs, drafts, strict=True))
        return drafts

    drafter.propose = recording  # type: ignore[method-assign]
    doc = [(13 * i + 5) % 255 for i in range(30)]
    prompts = [doc + [1, 2], doc + [1, 2], doc[:20] + [7], [4, 4, 4, 9]]
    for together in (False, True):
        reqs = [GenerateRequest(f"r{i}{together}", p, greedy(9)) for i, p in enumerate(prompts)]
        ref = run(plain, [GenerateRequest(r.rid, r.input_ids, r.sampling) for r in reqs], together=False)
        got = run(core, reqs, together=together)
        assert {r.rid: got.tokens(r.rid) for r in reqs} == {r.rid: ref.tokens(r.rid) for r in reqs}
    assert sum(got.final(f"r{i}True").cached_tokens for i in range(4)) > 0
    assert len(proposals) > 20
    mismatched = [(seq, d) for seq, d in proposals if d != reference_drafts(core, seq, STEPS)]
    assert not mismatched, f"{len(mismatched)} of {len(proposals)} proposals differ, first: {mismatched[0]}"


def test_nextn_without_mtp_weights_or_on_another_family_refuses(tmp_path: Path) -> None:
    from runtime.engine.pool_setup import EngineStartupError

    plain = build_tiny_qwen3_next(tmp_path / "plain")
    with pytest.raises(EngineStartupError, match=r"no mtp\.\* weights.*speculative_draft_model_path"):
        make_core(plain, speculative_algorithm="EAGLE")
