"""What every route handler needs: engine, tokenizer, launch options, and the server's own counters."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from hybridshared.flags.runtime_args import RuntimeArgs
from runtime.core.requests import EngineStats
from runtime.engine.api import EngineClient
from runtime.server.engine_bridge import AsyncEngine
from runtime.server.generate_request import PreparedRequest, RequestValueError
from runtime.server.limits import BadJson, BodyTooLarge, default_body_limit, parse_json, prompt_too_long, read_body
from runtime.server.metrics import RequestTimings
from runtime.server.request_state import RequestState
from runtime.server.structured import attach_grammars
from runtime.server.tokenizer import ServerTokenizer

if TYPE_CHECKING:
    from runtime.scheduler.grammar import GrammarBackend

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
    flushing: bool = False  # a /flush_cache?timeout=N is waiting for the engine to go idle
    grammar_backend: GrammarBackend | None = None  # None: --grammar-backend none (constrained requests get 400)
    _engine: AsyncEngine | None = None

    @property
    def body_limit(self) -> int:
        """Largest request body in bytes (--max-request-body-bytes, else sized from the context length)."""
        return self.args.max_request_body_bytes or default_body_limit(self.context_len)

    def engine_failure(self) -> str | None:
        """Why the engine loop died, or None while it runs."""
        return self.client.failure()

    def encode_prompt(self, text: str) -> list[int]:
        """Tokenize a prompt; refused before tokenizing when its size alone cannot fit the context.

        Runs on a worker thread (the routes call it through `asyncio.to_thread`): the event loop stays free.
        """
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise RequestValueError("the text is not valid Unicode (it holds a lone surrogate escape)") from None
        problem = prompt_too_long(size, self.tokenizer.max_token_bytes, self.context_len)
        if problem is not None:
            raise RequestValueError(problem)
        return self.tokenizer.encode(text)

    async def compile_grammars(self, prepared: list[PreparedRequest]) -> None:
        """Compile the requests' constraints on a worker thread; RequestValueError when one does not compile.

        Requests without one skip the thread: a hop to a worker and back costs ~1 ms of time to first token."""
        if any(p.constraint is not None for p in prepared):
            await asyncio.to_thread(attach_grammars, self.grammar_backend, prepared, self.args.disaggregation_mode)

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


def error_response(
    message: str, status: int = 400, err_type: str = "BadRequestError", headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The OpenAI-style error body SGLang returns from its OpenAI routes and for malformed JSON."""
    return JSONResponse(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": status},
        status_code=status,
        headers=dict(headers) if headers else None,
    )


_INLINE_PARSE_BYTES = 64 << 10  # larger bodies are parsed on a worker thread


async def json_body(request: Request) -> Any:
    """The JSON body; BodyTooLarge (413) past the limit, read no further, BadJson (400) when it is not JSON."""
    ctx: ServerContext = request.app.state.ctx
    raw = await read_body(request, ctx.body_limit)
    if len(raw) <= _INLINE_PARSE_BYTES:
        return parse_json(raw)
    return await asyncio.to_thread(parse_json, raw)


def body_error(e: BadJson) -> JSONResponse:
    """The answer to a body that is too large (413) or not JSON (400)."""
    if isinstance(e, BodyTooLarge):
        return error_response(str(e), 413, "RequestEntityTooLarge")
    return error_response(str(e), err_type="Bad Request")


async def watch_disconnect(request: Request, on_disconnect: Callable[[], None]) -> None:
    """Call `on_disconnect` if the client goes away while a non-streaming answer is being computed."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return
