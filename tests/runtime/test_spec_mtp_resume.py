"""NEXTN drafts after prefix-cache hits: a request that resumes from a cached state at m mixes h_{m-1} with ITS
token m, not the token of the request that cached the state. Each case below resumes somewhere the cacher left
differently: from a request that ended at its first token (never drafted), at a branch point whose next token
differs, and after a whole previous turn (the end-of-request state, accepted drafts included)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.core.requests import GenerateRequest
from runtime.speculative.mtp import MtpDrafter
from tests.runtime.test_engine_support import build_tiny_qwen3_next, greedy, make_core, one_torch_thread
from tests.runtime.test_engine_support import run_to_completion as run
from tests.runtime.test_spec_mtp import reference_drafts, with_mtp_weights

STEPS = 3


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(tmp_path_factory.mktemp("mtp_resume"))
    return with_mtp_weights(build_tiny_qwen3_next(root / "plain"), root / "with_mtp")


def test_drafts_after_resuming_at_branch_points_and_after_a_turn_equal_a_from_scratch_mtp(model_dir: Path) -> None:
    plain = make_core(model_dir, disable_radix_cache=True, chunked_prefill_size=-1)
    core = make_core(
        model_dir, speculative_algorithm="NEXTN", speculative_num_steps=STEPS, chunked_prefill_size=7,
        mamba_track_interval=8,
    )  # fmt: skip
    drafter = core.spec.drafter  # type: ignore[union-attr]
    assert isinstance(drafter, MtpDrafter)
    proposals: dict[str, list[tuple[list[int], list[int]]]] = {}
    original = drafter.propose

    def recording(reqs: list) -> list[list[int]]:
        drafts = original(reqs)
        for r, d in zip(reqs, drafts, strict=True):
            proposals.setdefault(r.rid, []).append((list(r.all_ids), list(d)))
        return drafts

    drafter.propose = recording  # type: ignore[method-assign]
    doc = [(29 * i + 11) % 251 for i in range(30)]

    def one(rid: str, prompt: list[int], max_new: int, cached: int) -> list[int]:
        want = run(plain, [GenerateRequest(rid, prompt, greedy(max_new))], together=False).tokens(rid)
        got = run(core, [GenerateRequest(rid, prompt, greedy(max_new))], together=False)
        assert got.tokens(rid) == want
        assert got.final(rid).cached_tokens == cached, rid
        return got.tokens(rid)

    # "a" ends at its first token: it never drafts, yet the KV pages it caches (checkpoints at 8 and 16, its tail's
    # 24-31 (runtime/scheduler/checkpoints.py) and its end state at 32) must carry MTP K/V for the next request.
    one("a", doc + [1, 2], 1, 0)
    # "b" resumes at a's end state (32 = doc + [1, 2]); its token 32 is its own.
    one("b", doc + [1, 2, 5, 6], 8, 32)
    # "c" shares doc + [1] with both: resumes at a's tail checkpoint 31 (a's prompt but its last token).
    one("c", doc + [1, 7, 8], 8, 31)
    # "d" resumes there too, with a token 31 (9) that differs from c's (7).
    d_out = one("d", doc + [1, 9, 3], 8, 31)
    # "e" is d's next turn: it resumes from d's end state (prompt + output[:-1]), whose last positions came from
    # accepted drafts.
    d_conv = doc + [1, 9, 3] + d_out[:-1]
    one("e", d_conv + [4, 4], 6, len(d_conv))
    assert set(proposals) == {"b", "c", "d", "e"}
    mismatched = [
        (rid, seq, d) for rid, props in proposals.items() for seq, d in props if d != reference_drafts(core, seq, STEPS)
    ]
    total = sum(len(p) for p in proposals.values())
    assert not mismatched, f"{len(mismatched)} of {total} proposals differ, first: {mismatched[0]}"
