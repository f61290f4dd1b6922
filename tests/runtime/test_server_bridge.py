"""The asyncio bridge (runtime/server/engine_bridge.py) on a real threaded engine: every output arrives, in
order, the same tokens as read straight off the engine thread, the event loop is woken about once per
engine step for all running requests, not once per token, and a step that produced first tokens waits for the
loop to take them before the engine goes on."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
from runtime.engine.api import EngineClient
from runtime.engine.engine_thread import start_engine
from runtime.server.engine_bridge import AsyncEngine, RequestGroup

N_REQ, N_NEW = 8, 24


@pytest.fixture(scope="module")
def client(demo_model_dir: Path) -> Any:
    c = start_engine(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.5))
    yield c
    c.shutdown()


def _requests(tag: str) -> list[GenerateRequest]:
    params = SamplingParams(temperature=0, max_new_tokens=N_NEW, ignore_eos=True)
    return [GenerateRequest(f"{tag}{i}", [(7 * i + j) % 3000 + 10 for j in range(40)], params) for i in range(N_REQ)]


def _direct(client: EngineClient, requests: list[GenerateRequest]) -> dict[str, list[int]]:
    """The tokens each request gets when its outputs are read on the engine thread itself."""
    tokens: dict[str, list[int]] = {r.rid: [] for r in requests}
    done = threading.Semaphore(0)

    def on_output(out: RequestOutput) -> None:
        tokens[out.rid].extend(out.new_token_ids)
        if out.finished:
            done.release()

    for r in requests:
        client.add_request(r, on_output)
    for _ in requests:
        assert done.acquire(timeout=120)
    return tokens


async def _bridged(client: EngineClient, requests: list[GenerateRequest]) -> tuple[dict[str, list[int]], int, int]:
    """(tokens per request, outputs seen, event-loop wake-ups the bridge asked for)."""
    loop = asyncio.get_running_loop()
    wakes = 0
    real = loop.call_soon_threadsafe

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal wakes
        wakes += 1
        return real(*args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        group = RequestGroup(AsyncEngine(client, loop), requests)
        tokens: dict[str, list[int]] = {r.rid: [] for r in requests}
        finished: list[str] = []
        outputs = 0
        async for index, out in group.updates():
            assert out.rid == requests[index].rid
            assert out.rid not in finished, "an output after the request's final one"
            tokens[out.rid].extend(out.new_token_ids)
            outputs += 1
            if out.finished:
                assert out.finish_reason == {"type": "length", "length": N_NEW}
                finished.append(out.rid)
        assert sorted(finished) == sorted(r.rid for r in requests)
        return tokens, outputs, wakes
    finally:
        del loop.call_soon_threadsafe


def test_bridge_delivers_every_token_with_one_wake_up_per_step(client: EngineClient) -> None:
    direct = _direct(client, _requests("d"))
    bridged, outputs, wakes = asyncio.run(_bridged(client, _requests("b")))
    assert [bridged[f"b{i}"] for i in range(N_REQ)] == [direct[f"d{i}"] for i in range(N_REQ)]
    assert all(len(t) == N_NEW for t in bridged.values())
    assert outputs >= N_REQ * N_NEW  # one output per request per step (no token was merged away)
    # The 8 requests prefill and decode together, so each step has 8 outputs; one wake-up drains them all
    # (per token it would be 8 x 24 = 192). Slack for a GIL switch that lets the loop in mid-step.
    assert wakes <= 2 * (N_NEW + 2), f"{wakes} wake-ups for {outputs} outputs"


async def _first_tokens_seen_at_handoff(client: EngineClient) -> tuple[AsyncEngine, list[int]]:
    """Streams a group through the bridge; a step listener registered after the bridge's (so it runs on the
    engine thread right after the bridge's own, before the next step) records how many requests' first tokens
    the event loop had consumed each time a handoff completed."""
    loop = asyncio.get_running_loop()
    engine = AsyncEngine(client, loop)
    seen_first: set[str] = set()
    at_handoff: list[int] = []
    answered = 0

    def after_bridge() -> None:  # engine thread
        nonlocal answered
        if engine.handoffs > answered:
            answered = engine.handoffs
            at_handoff.append(len(seen_first))

    client.add_step_listener(after_bridge)  # like the bridge's, it stays with the module's engine (harmless)
    async for _, out in RequestGroup(engine, _requests("h")).updates():
        if out.new_token_ids:
            seen_first.add(out.rid)
    return engine, at_handoff


def test_first_token_step_waits_for_the_loop_to_take_it(client: EngineClient) -> None:
    engine, at_handoff = asyncio.run(_first_tokens_seen_at_handoff(client))
    # Only steps that produced some request's first token hand over: at most one per request, never per token.
    assert 1 <= engine.handoffs + engine.handoff_timeouts <= N_REQ
    assert engine.handoffs >= 1, "the idle event loop never answered a handoff within its timeout"
    # When the engine thread went on, the loop had already consumed the first tokens it was handed.
    assert at_handoff and all(n >= 1 for n in at_handoff), at_handoff
