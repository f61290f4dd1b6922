"""OpenAI-compatible routes as SGLang serves them: /v1/models, /v1/completions, /v1/chat/completions.

Requests are translated into the same engine requests as /generate (one parser of sampling parameters);
answers carry SGLang's extras (`matched_stop`, `usage.prompt_tokens_details.cached_tokens`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.server.chat import ChatOptions, ChatOutput, chat_prompt_and_options
from runtime.server.context import ServerContext, body_error, error_response, json_body
from runtime.server.engine_bridge import DuplicateRequestId, RequestGroup
from runtime.server.fanout import fan_out
from runtime.server.field_refusals import CHAT_REFUSED, COMPLETIONS_REFUSED, OPENAI_REFUSED, refuse_unimplemented
from runtime.server.generate_api import EngineUnavailable, abort_error, run_to_end, start_group
from runtime.server.generate_request import ContractError, PreparedRequest, RequestValueError, checked_inline
from runtime.server.limits import BadJson
from runtime.server.openai_request import chat_prompt_ids, completion_prompts, prepare_openai
from runtime.server.request_state import RequestState
from runtime.server.sse import DONE, AbortingStreamingResponse, sse_event


def _ctx(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    return ctx


def _model_card(ctx: ServerContext) -> dict[str, Any]:
    return {
        "id": ctx.model_name,
        "object": "model",
        "created": int(ctx.startup_time),
        "owned_by": "sglang",
        "root": ctx.model_name,
        "max_model_len": ctx.context_len,
    }


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(_ctx(request))]})


async def retrieve_model(request: Request) -> Response:
    ctx = _ctx(request)
    model = request.path_params["model"]
    if model != ctx.model_name:
        error = {"message": f"The model '{model}' does not exist", "type": "invalid_request_error",
                 "param": "model", "code": "model_not_found"}  # fmt: skip
        return JSONResponse({"error": error}, status_code=404)
    return JSONResponse(_model_card(ctx))


def _usage(states: list[RequestState]) -> dict[str, Any]:
    # As SGLang's UsageProcessor: a prompt's tokens count once, not once per continuation (n > 1).
    firsts = [s for s in states if s.prepared.index % s.prepared.n == 0]
    prompt = sum(s.prompt_tokens for s in firsts)
    completion = sum(s.completion_tokens for s in states)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(s.cached_tokens for s in firsts)},
    }


def _sglext(body: dict[str, Any], states: list[RequestState]) -> dict[str, Any] | None:
    """SGLang's response-level `sglext` with `return_cached_tokens_details`: the first request's details."""
    if body.get("return_cached_tokens_details") is not True:
        return None
    details = next((d for s in states if (d := s.meta_info()["cached_tokens_details"]) is not None), None)
    return None if details is None else {"cached_tokens_details": details}


def _finish(state: RequestState) -> tuple[str | None, Any]:
    reason = state.finish_reason or {}
    return reason.get("type"), reason.get("matched")


async def _parse(request: Request) -> dict[str, Any] | Response:
    try:
        body = await json_body(request)
    except BadJson as e:
        return body_error(e)
    if not isinstance(body, dict):
        return error_response("The request body must be a JSON object.")
    return body


async def completions(request: Request) -> Response:
    received = time.perf_counter()
    ctx = _ctx(request)
    body = await _parse(request)
    if isinstance(body, Response):
        return body
    try:
        refuse_unimplemented(body, OPENAI_REFUSED, COMPLETIONS_REFUSED)
        prompt = body.get("prompt")
        # Tokenizing runs off the loop; a prompt of token ids is checked inline (checked_inline).
        prompts = (
            completion_prompts(ctx, prompt)
            if checked_inline(prompt)
            else await asyncio.to_thread(completion_prompts, ctx, prompt)
        )
        if body.get("max_tokens") is None:
            body["max_tokens"] = 16  # OpenAI's (and SGLang's) default for completions
        prepared = [prepare_openai(ctx, body, ids, ("max_tokens",), index=i) for i, ids in enumerate(prompts)]
        prepared = fan_out(prepared)  # n > 1: choice i*n + j is sample j of prompt i
        await ctx.compile_grammars(prepared)  # structured output; a bad grammar is a 400
    except (RequestValueError, ContractError) as e:
        return error_response(str(e))
    return await _serve(ctx, request, body, prepared, received, chat=None)


async def chat_completions(request: Request) -> Response:
    received = time.perf_counter()
    ctx = _ctx(request)
    body = await _parse(request)
    if isinstance(body, Response):
        return body
    try:
        refuse_unimplemented(body, OPENAI_REFUSED, CHAT_REFUSED)
        prompt, opts = chat_prompt_and_options(body, ctx.args.tool_call_parser, ctx.args.reasoning_parser)
        if opts.constraint is not None and ctx.grammar_backend is not None:
            # SGLang's constraint for these choices: the JSON array of calls from the first token, so there is
            # no think block to split off.
            body = {**body, "json_schema": json.dumps(opts.constraint)}
            opts.reasoning_parser = None
        ids = await asyncio.to_thread(chat_prompt_ids, ctx, prompt, opts)
        prepared = fan_out([prepare_openai(ctx, body, ids, ("max_completion_tokens", "max_tokens"), chat=True)])
        if opts.parses_tools:  # SGLang keeps special tokens then: call markers often are special tokens
            for p in prepared:
                p.skip_special_tokens = False
        await ctx.compile_grammars(prepared)  # structured output; a bad grammar is a 400
    except (RequestValueError, ContractError) as e:
        return error_response(str(e))
    return await _serve(ctx, request, body, prepared, received, chat=opts)


def _choice_logprobs(
    state: RequestState, chat: bool, start: int = 0, end: int | None = None, echo: bool = False
) -> dict[str, Any] | None:
    """A choice's `logprobs` for output tokens [start, end): chat `{"content": [...]}`, completions' lists."""
    view = state.logprobs
    if view is None:
        return None
    if chat:
        return {"content": view.chat_content(start, end)}
    return view.completion_logprobs(start, end, echo=echo)


def _echo_texts(ctx: ServerContext, body: dict[str, Any], prepared: list[PreparedRequest]) -> list[str]:
    """Completions `echo`: each choice's prompt, as sent when it was text (SGLang's), else decoded."""
    if body.get("echo") is not True:
        return [""] * len(prepared)
    prompt = body.get("prompt")
    texts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    return [
        texts[k] if k < len(texts) and isinstance(texts[k], str) else ctx.tokenizer.decode(p.request.input_ids)
        for p, k in ((p, p.index // p.n) for p in prepared)  # with n > 1, choice i*n + j echoes prompt i
    ]


async def _serve(
    ctx: ServerContext,
    request: Request,
    body: dict[str, Any],
    prepared: list[PreparedRequest],
    received: float,
    chat: ChatOptions | None,
) -> Response:
    try:
        group, states = start_group(ctx, prepared, received)
    except (DuplicateRequestId, RequestValueError) as e:
        return error_response(str(e))
    except EngineUnavailable as e:
        return error_response(str(e), 503, "ServiceUnavailable")
    given_model = body.get("model")
    model = given_model if isinstance(given_model, str) else ctx.model_name
    chat_mode = chat is not None
    response_id = ("chatcmpl-" if chat_mode else "cmpl-") + prepared[0].request.rid
    if prepared[0].request.stream:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        echo = [] if chat is not None else _echo_texts(ctx, body, prepared)
        chunks = _stream(ctx, group, states, response_id, model, chat, include_usage, _sglext_later(body, states), echo)
        return AbortingStreamingResponse(chunks, on_close=group.close)
    await run_to_end(ctx, request, group, states)
    failure = abort_error(states)
    if failure is not None:
        return error_response(json.loads(bytes(failure.body))["error"]["message"], failure.status_code)
    choices: list[dict[str, Any]] = []
    echo = [""] * len(states) if chat is not None else _echo_texts(ctx, body, prepared)
    for state in states:
        finish_reason, matched = _finish(state)
        choice: dict[str, Any] = {
            "index": state.prepared.index,
            "logprobs": _choice_logprobs(state, chat is not None, echo=True),
            "finish_reason": finish_reason,
            "matched_stop": matched,
        }
        if chat is not None:
            output = ChatOutput(chat)
            choice["message"] = output.message(state.text())
            choice["finish_reason"] = output.finish_reason(finish_reason)
            if choice["finish_reason"] != finish_reason:
                choice["matched_stop"] = None
        else:
            choice["text"] = echo[state.prepared.index] + state.text()
        choices.append(choice)
    answer = {
        "id": response_id,
        "object": "chat.completion" if chat_mode else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(states),
    }
    sglext = _sglext(body, states[:1])  # SGLang: from the first choice's request only
    if sglext is not None:
        answer["sglext"] = sglext
    return JSONResponse(answer)


async def _stream(
    ctx: ServerContext,
    group: RequestGroup,
    states: list[RequestState],
    response_id: str,
    model: str,
    chat: ChatOptions | None,
    include_usage: bool,
    sglext: Callable[[], dict[str, Any] | None],
    echo: list[str],
) -> AsyncIterator[bytes]:
    created = int(time.time())
    kind = "chat.completion.chunk" if chat is not None else "text_completion"
    outputs = [ChatOutput(chat) for _ in states] if chat is not None else []
    lp_sent = [0] * len(states)  # output tokens whose logprobs went out
    echo_due = [bool(e) for e in echo] or [False] * len(states)

    def logprobs_now(index: int) -> dict[str, Any] | None:
        state, start = states[index], lp_sent[index]
        lp_sent[index] = len(state.output_ids)
        return _choice_logprobs(state, chat is not None, start, lp_sent[index], echo=start == 0)

    def chunk(
        index: int,
        delta: str | dict[str, Any] | None,
        finish_reason: str | None = None,
        matched: Any = None,
        ext: Any = None,
    ) -> bytes:
        logprobs = logprobs_now(index) if delta is not None and finish_reason is None else None
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["matched_stop"] = matched
        if chat is not None:
            choice["delta"] = delta if isinstance(delta, dict) else {}
        else:
            choice["text"] = delta or ""
        payload = {"id": response_id, "object": kind, "created": created, "model": model, "choices": [choice]}
        if ext is not None:
            payload["sglext"] = ext
        return sse_event(payload)

    for index in range(len(states) if chat is not None else 0):  # a chat choice's first chunk announces the role
        yield sse_event({"id": response_id, "object": kind, "created": created, "model": model,
                         "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}]})  # fmt: skip
    sent = [""] * len(states)
    async for i, out in group.updates():
        state = states[i]
        state.update(out)
        text = state.stream_text()  # a possible start of a stop string waits until it cannot be one
        # A stop string trimmed at the end can shorten the text: nothing more is sent then.
        delta = text[len(sent[i]) :] if text.startswith(sent[i]) else ""
        sent[i] += delta
        if echo_due[i]:  # completions echo: the prompt leads the choice's first chunk
            delta, echo_due[i] = echo[i] + delta, False
        if chat is not None:  # reasoning and tool calls split out of the text
            for piece in outputs[i].deltas(delta, final=out.finished):
                yield chunk(i, piece)
        elif delta:
            yield chunk(i, delta)
        if out.finished:
            ctx.finish(state, streaming=True)
            finish_reason, matched = _finish(state)
            if chat is not None and outputs[i].finish_reason(finish_reason) != finish_reason:
                finish_reason, matched = outputs[i].finish_reason(finish_reason), None
            # Completions: sglext rides on the last finish chunk. SGLang 0.5.23 sends it in a chunk with
            # "choices": [], which its own bench_serving completions reader indexes ([0]) and fails on, so
            # `--cache-report` on sglang-oai lost every request; the field and its value are SGLang's.
            last = chat is None and all(s.finished for s in states)
            yield chunk(i, None if chat is not None else "", finish_reason, matched, sglext() if last else None)
    extension = sglext() if chat is not None else None
    if extension is not None:  # SGLang sends it at response level, in a chunk of its own, before the usage
        yield sse_event({"id": response_id, "object": kind, "created": created, "model": model, "choices": [],
                         "sglext": extension})  # fmt: skip
    if include_usage:
        yield sse_event({"id": response_id, "object": kind, "created": created, "model": model, "choices": [],
                         "usage": _usage(states)})  # fmt: skip
    yield DONE


def _sglext_later(body: dict[str, Any], states: list[RequestState]) -> Callable[[], dict[str, Any] | None]:
    """`_sglext` once the stream has ended: SGLang takes the first choice that reported details."""
    return lambda: _sglext(body, states)


def routes() -> list[Route]:
    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
