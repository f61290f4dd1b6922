"""SGLang's native `/generate`: one prompt or a batch, whole answers or an SSE stream of cumulative chunks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runtime.server.context import ServerContext, body_error, json_body, watch_disconnect
from runtime.server.engine_bridge import DuplicateRequestId, RequestGroup
from runtime.server.fanout import fan_out
from runtime.server.field_refusals import GENERATE_REFUSED, refuse_unimplemented
from runtime.server.generate_request import (
    ContractError,
    PreparedRequest,
    RequestValueError,
    checked_inline,
    parse_generate_body,
)
from runtime.server.limits import BadJson
from runtime.server.request_state import RequestState
from runtime.server.sse import DONE, AbortingStreamingResponse

logger = logging.getLogger("runtime.server")


def value_error(message: str, status: int = 400) -> JSONResponse:
    """SGLang's body for a request it understood but cannot serve."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


class EngineUnavailable(RuntimeError):
    """The engine loop is not running (it died): the request gets 503, the process is on its way out."""


def start_group(
    ctx: ServerContext, prepared: list[PreparedRequest], received: float
) -> tuple[RequestGroup, list[RequestState]]:
    """Submit the requests; raises DuplicateRequestId before anything runs when a rid is already in flight,
    RequestValueError when the engine refuses one (a PD room in use), EngineUnavailable when it is down.
    `received` (perf_counter at the handler's start) is where TTFT and e2e latency count from: as SGLang's
    created_time, it holds body parsing and tokenization."""
    states = [RequestState(p, ctx.tokenizer, created=received) for p in prepared]
    failure = ctx.engine_failure()
    if failure is not None:
        raise EngineUnavailable(f"The engine is not running ({failure}); the server is restarting.")
    try:
        group = RequestGroup(ctx.engine, [p.request for p in prepared])
    except DuplicateRequestId:
        raise
    except ValueError as e:
        raise RequestValueError(str(e)) from None
    except RuntimeError as e:
        raise EngineUnavailable(str(e)) from None
    if ctx.args.log_requests:
        for p in prepared:
            logger.info(
                "Receive: rid=%s, prompt_tokens=%d, sampling_params=%s, stream=%s",
                p.request.rid,
                len(p.request.input_ids),
                vars(p.request.sampling),
                p.request.stream,
            )
    return group, states


async def run_to_end(ctx: ServerContext, request: Request, group: RequestGroup, states: list[RequestState]) -> None:
    """Drive a non-streaming group to its end; a client that hangs up aborts it."""
    watcher = asyncio.create_task(watch_disconnect(request, group.close))
    try:
        async for index, out in group.updates():
            states[index].update(out)
            if out.finished:
                ctx.finish(states[index], streaming=False)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def abort_error(states: list[RequestState]) -> JSONResponse | None:
    """SGLang turns an engine abort carrying an HTTP status (allocation failure) into an error answer."""
    for s in states:
        reason = s.finish_reason or {}
        status = reason.get("status_code")
        if reason.get("type") == "abort" and isinstance(status, int) and 400 <= status < 600:
            return value_error(str(reason.get("message", "request aborted")), status)
    return None


async def generate(request: Request) -> Response:
    received = time.perf_counter()
    ctx: ServerContext = request.app.state.ctx
    try:
        body = await json_body(request)
    except BadJson as e:
        return body_error(e)
    try:
        if isinstance(body, dict):
            refuse_unimplemented(body, GENERATE_REFUSED)
        parse = functools.partial(
            parse_generate_body, body, encode=ctx.encode_prompt, vocab_size=ctx.vocab_size, context_len=ctx.context_len
        )
        # Tokenizing is CPU work: on a worker thread, so /health and other requests are answered meanwhile; a
        # prompt of token ids is checked inline (checked_inline).
        text = body.get("text") if isinstance(body, dict) else None
        inline = isinstance(body, dict) and text is None and checked_inline(body.get("input_ids"))
        prepared, single, stream = parse() if inline else await asyncio.to_thread(parse)
        expanded = fan_out(prepared)  # n > 1: n continuations per prompt, answered as a batch
        # Structured output, after the fan-out so that each continuation owns its grammar; a bad one is a 400.
        await ctx.compile_grammars(expanded)
    except ContractError as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    except RequestValueError as e:
        return value_error(str(e))
    single = single and len(expanded) == len(prepared)
    prepared = expanded
    try:
        group, states = start_group(ctx, prepared, received)
    except (DuplicateRequestId, RequestValueError) as e:
        return value_error(str(e))
    except EngineUnavailable as e:
        return value_error(str(e), 503)
    if stream:
        return AbortingStreamingResponse(_stream(ctx, group, states, single), on_close=group.close)
    await run_to_end(ctx, request, group, states)
    failure = abort_error(states)
    if failure is not None:
        return failure
    if single:
        return JSONResponse(states[0].to_dict(with_index=False))
    return JSONResponse([s.to_dict(with_index=False) for s in states])


async def _stream(
    ctx: ServerContext, group: RequestGroup, states: list[RequestState], single: bool
) -> AsyncIterator[bytes]:
    sent = [0] * len(states)  # tokens each request's chunks have carried so far
    async for batch in group.batches():
        # One chunk per request per batch: outputs that queued up while the loop was busy go out together
        # (chunks are cumulative, as SGLang's with stream_interval > 1), which is what lets it catch up.
        changed: dict[int, None] = {}
        for index, out in batch:
            state = states[index]
            state.update(out)
            if out.finished:
                ctx.finish(state, streaming=True)
            if out.finished or out.new_token_ids:
                changed[index] = None
        for index in changed:
            state = states[index]
            if state.finished or _chunk_due(state, sent[index]):
                sent[index] = len(state.output_ids)
                yield state.sse_chunk(with_index=not single)
    yield DONE


def _chunk_due(state: RequestState, sent: int) -> bool:
    """SGLang's rule (scheduler_components/output_streamer.py): every step at stream_interval 1; otherwise the
    first token at once, then whenever at least stream_interval tokens are unsent."""
    unsent = len(state.output_ids) - sent
    interval = state.prepared.stream_interval
    due = unsent > 0 and (interval == 1 or unsent >= interval or sent == 0)
    # ... and not while the text ends in what may become a stop string.
    return due and not state.holds_stop_prefix()
