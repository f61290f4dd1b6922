"""What every route handler needs: engine, tokenizer, launch options, and the server's own counters."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from runtime.args import RuntimeArgs
from runtime.engine.api import EngineClient, EngineStats
from runtime.server.engine_bridge import AsyncEngine
from runtime.server.metrics import RequestTimings
from runtime.server.request_state import RequestState
from runtime.server.tokenizer import ServerTokenizer

logger = logging.getLogger("runtime.server")


@dataclass
class ServerContext:
    args: RuntimeArgs
    client: EngineClient
    tokenizer: ServerTokenizer
    hf_config: dict[str, Any]
    context_len: int
    vocab_size: int
    timings: RequestTimings = field(default_factory=RequestTimings)
    startup_time: float = field(default_factory=time.time)
    ready: bool = False
    _engine: AsyncEngine | None = None

    @property
    def engine(self) -> AsyncEngine:
        """The asyncio bridge, bound to the running event loop on first use."""
        if self._engine is None:
            self._engine = AsyncEngine(self.client, asyncio.get_running_loop())
        return self._engine

    @property
    def model_name(self) -> str:
        return self.args.resolved_served_model_name

    async def stats(self) -> EngineStats:
        # The engine takes its lock to snapshot; never block the event loop on a model step.
        return await asyncio.to_thread(self.client.stats)

    def finish(self, state: RequestState, streaming: bool) -> None:
        """Account a finished request: latency histograms, and the request log line with --log-requests."""
        self.timings.observe_request(streaming, state.ttft, state.e2e_latency, state.token_times)
        if self.args.log_requests:
            logger.info(
                "Finish: rid=%s, finish_reason=%s, prompt_tokens=%d, completion_tokens=%d, cached_tokens=%d, "
                "e2e_latency=%.3f",
                state.rid,
                json.dumps(state.finish_reason),
                state.prompt_tokens,
                state.completion_tokens,
                state.cached_tokens,
                state.e2e_latency,
            )


def read_hf_config(model_path: str) -> dict[str, Any]:
    path = Path(model_path) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def error_response(message: str, status: int = 400, err_type: str = "BadRequestError") -> JSONResponse:
    """The OpenAI-style error body SGLang returns from its OpenAI routes and for malformed JSON."""
    return JSONResponse(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": status},
        status_code=status,
    )


class BadJson(ValueError):
    pass


async def json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadJson(f"JSON decode error: {e}") from None


async def watch_disconnect(request: Request, on_disconnect: Any) -> None:
    """Call `on_disconnect` if the client goes away while a non-streaming answer is being computed."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return
