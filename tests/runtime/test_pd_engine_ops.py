"""PD's two pool operations in-process: a prefill engine stages each prompt's KV and state (through the
protocol's bytes), a decode engine injects them and continues; greedy tokens equal one engine's, whatever the
page sizes on either side, and neither side keeps a page or slot afterwards."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.core.requests import GenerateRequest
from runtime.pd.engine_ops import inject, stage
from runtime.pd.protocol import Staged, unpack_payload
from tests.runtime.test_engine_support import build_tiny_qwen3_next, greedy, make_core, one_torch_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_next(Path(tmp_path_factory.mktemp("pd-ops")) / "model")


def idle(core: object) -> None:
    total, free, cached, in_use = core.cache.page_counts()  # type: ignore[attr-defined]
    assert in_use == 0 and core.cache.slot_counts()[3] == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(("prefill_page", "decode_page"), [(1, 1), (4, 1), (1, 8)])
def test_staged_prefill_injected_into_decode_continues_token_identically(
    model_dir: Path, prefill_page: int, decode_page: int
) -> None:
    rng = random.Random(prefill_page * 10 + decode_page)
    prompts = [[rng.randrange(255) for _ in range(n)] for n in (5, 33, 70)]
    prompts.append(prompts[1][:20] + [7, 7, 7])  # shares a prefix: a prefix-cache hit on the prefill side
    prefill = make_core(model_dir, page_size=prefill_page, mamba_track_interval=8)
    decode = make_core(model_dir, page_size=decode_page, mamba_track_interval=8)
    reference = make_core(model_dir, disable_radix_cache=True, chunked_prefill_size=-1)
    staged: dict[str, Staged] = {}
    prefill.before_release(lambda req: staged.__setitem__(req.rid, stage(prefill, req)))
    got: dict[str, list[int]] = {}
    want: dict[str, list[int]] = {}
    for i, ids in enumerate(prompts):
        rid = f"r{i}"
        first = GenerateRequest(rid, ids, greedy(1))
        prefill.scheduler.add_request(first, lambda o: None)
        while prefill.scheduler.has_work:
            prefill.step()
            prefill.scheduler.check_invariants()
        head, payload = staged[rid].header({})
        tensors = unpack_payload(head, payload)
        g = GenerateRequest(rid, ids, greedy(10))
        assert inject(decode, g, lambda o: got.setdefault(o.rid, []).extend(o.new_token_ids), head, tensors) is None
        decode.scheduler.check_invariants()
        while decode.scheduler.has_work:
            decode.step()
            decode.scheduler.check_invariants()
        reference.scheduler.add_request(g, lambda o: want.setdefault(o.rid, []).extend(o.new_token_ids))
        while reference.scheduler.has_work:
            reference.step()
    assert got == want
    assert staged["r3"].cached_tokens > 0  # the prefix hit travels with the transfer
    idle(prefill)
    idle(decode)
