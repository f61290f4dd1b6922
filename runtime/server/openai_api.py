"""OpenAI-compatible routes as SGLang serves them: /v1/models, /v1/completions, /v1/chat/completions.

Requests are translated into the same engine requests as /generate (one parser of sampling parameters);
answers carry SGLang's extras (`matched_stop`, `usage.prompt_tokens_details.cached_tokens`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.server.chat import ChatOptions, ChatOutput, ChatPrompt, chat_prompt_and_options
from runtime.server.context import ServerContext, body_error, error_response, json_body
from runtime.server.engine_bridge import DuplicateRequestId, RequestGroup
from runtime.server.fanout import fan_out
from runtime.server.field_refusals import CHAT_REFUSED, COMPLETIONS_REFUSED, OPENAI_REFUSED, refuse_unimplemented
from runtime.server.generate_api import EngineUnavailable, abort_error, run_to_end, start_group
from runtime.server.generate_request import (
    ContractError,
    PreparedRequest,
    RequestValueError,
    apply_bootstrap_fields,
    apply_logprob_fields,
    checked_inline,
    is_token_ids,
    parse_sampling_params,
    prepare_request,
    short_repr,
)
from runtime.server.limits import BadJson
from runtime.server.reasoning import ReasoningParser
from runtime.server.request_state import RequestState
from runtime.server.sse import DONE, AbortingStreamingResponse, sse_event
from runtime.server.structured import response_format_schema

# OpenAI request field -> SGLang sampling parameter (the rest of the body is ignored, as OpenAI clients send
# many optional fields).
_SAMPLING_MAP = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "seed": "sampling_seed",
    "n": "n",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_new_tokens",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "logit_bias": "logit_bias",
    "regex": "regex",
    "json_schema": "json_schema",
    "ebnf": "ebnf",
}


# Accepted only at their neutral values.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
}


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


def _sampling_from_openai(
    body: dict[str, Any], max_tokens_keys: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, str]]:
    """SGLang sampling parameters from an OpenAI body, and each one's name as the client sent it."""
    raw: dict[str, Any] = {}
    names: dict[str, str] = {}
    for key, target in _SAMPLING_MAP.items():
        if body.get(key) is not None:
            raw[target] = body[key]
            names[target] = key
    for key in max_tokens_keys:
        if body.get(key) is not None:
            raw["max_new_tokens"] = body[key]
            names["max_new_tokens"] = key
            break
    for key, allowed in _UNSUPPORTED.items():
        if body.get(key) not in allowed:
            raise RequestValueError(f"{key}={short_repr(body[key])} is not implemented by the bundled runtime")
    schema = response_format_schema(body.get("response_format"))  # structured output (server/structured.py)
    if schema is not None:
        if raw.get("json_schema") is not None:
            raise RequestValueError("give either response_format or json_schema, not both")
        raw["json_schema"], names["json_schema"] = schema, "response_format"
    return raw, names


def _logprob_options(body: dict[str, Any], chat: bool) -> tuple[bool, int, int]:
    """(return_logprob, top_logprobs_num, logprob_start_len) as SGLang's OpenAI routes set them: chat `logprobs`
    + `top_logprobs`; completions `logprobs=N` (N top entries), with `echo` the prompt's too (start 0)."""
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if chat:
        if logprobs is not None and not isinstance(logprobs, bool):
            raise RequestValueError(f"logprobs must be a boolean, got {short_repr(logprobs)}")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
            raise RequestValueError(f"top_logprobs must be a non-negative integer, got {short_repr(top)}")
        return bool(logprobs), (top or 0) if logprobs else 0, -1
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
        raise RequestValueError(f"logprobs must be a non-negative integer, got {short_repr(logprobs)}")
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise RequestValueError(f"echo must be a boolean, got {short_repr(echo)}")
    return logprobs is not None, logprobs or 0, 0 if echo and logprobs is not None else -1


def _prepare(
    ctx: ServerContext,
    body: dict[str, Any],
    ids: list[int],
    max_keys: tuple[str, ...],
    index: int = 0,
    chat: bool = False,
) -> PreparedRequest:
    raw, names = _sampling_from_openai(body, max_keys)
    parsed = parse_sampling_params(raw, names)
    given_rid = body.get("rid")
    rid = given_rid if isinstance(given_rid, str) else uuid.uuid4().hex
    if index:  # the prompts of one batch need distinct engine request ids
        rid = f"{rid}-{index}"
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestValueError(f"stream must be a boolean, got {short_repr(stream)}")
    max_name = names.get("max_new_tokens", max_keys[-1])
    prepared = prepare_request(
        index, ids, parsed, rid, bool(stream), ctx.vocab_size, ctx.context_len, max_tokens_name=max_name
    )
    apply_bootstrap_fields(body, prepared.request, single=index == 0)  # PD: the router's one-prompt routing
    apply_logprob_fields(prepared, *_logprob_options(body, chat), True)
    return prepared


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


def _completion_prompts(ctx: ServerContext, prompt: Any) -> list[list[int]]:
    """OpenAI's prompt forms: a string, token ids, or a batch (list) of either."""
    if isinstance(prompt, str):
        return [ctx.encode_prompt(prompt)]
    if is_token_ids(prompt) and prompt:
        return [list(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or (is_token_ids(p) and p) for p in prompt):
        return [ctx.encode_prompt(p) if isinstance(p, str) else list(p) for p in prompt]
    if prompt is None:
        raise RequestValueError("prompt is required")
    raise RequestValueError("prompt must be a string, a list of token ids, or a non-empty list of either")


async def completions(request: Request) -> Response:
    ctx = _ctx(request)
    body = await _parse(request)
    if isinstance(body, Response):
        return body
    try:
        refuse_unimplemented(body, OPENAI_REFUSED, COMPLETIONS_REFUSED)
        prompt = body.get("prompt")
        # Tokenizing runs off the loop; a prompt of token ids is checked inline (checked_inline).
        prompts = (
            _completion_prompts(ctx, prompt)
            if checked_inline(prompt)
            else await asyncio.to_thread(_completion_prompts, ctx, prompt)
        )
        if body.get("max_tokens") is None:
            body["max_tokens"] = 16  # OpenAI's (and SGLang's) default for completions
        prepared = [_prepare(ctx, body, ids, ("max_tokens",), index=i) for i, ids in enumerate(prompts)]
        prepared = fan_out(prepared)  # n > 1: choice i*n + j is sample j of prompt i
        await ctx.compile_grammars(prepared)  # structured output; a bad grammar is a 400
    except (RequestValueError, ContractError) as e:
        return error_response(str(e))
    return await _serve(ctx, request, body, prepared, chat=None)


def _chat_prompt(ctx: ServerContext, prompt: ChatPrompt, opts: ChatOptions) -> list[int]:
    """Render and tokenize (worker thread): any template error is the request's 400, never a 500."""
    try:
        text = ctx.tokenizer.apply_chat_template(
            prompt.messages, add_generation_prompt=True, tools=prompt.tools, template_kwargs=prompt.template_kwargs
        )
    except ValueError as e:
        raise RequestValueError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - a template failing on these messages (TypeError, UndefinedError)
        raise RequestValueError(f"chat template error for these messages: {type(e).__name__}: {e}") from None
    if opts.reasoning_parser is not None:  # a think block the template (or the continued message) left open
        opts.starts_in_reasoning = ReasoningParser.prompt_opens_reasoning(
            opts.reasoning_parser, text + (prompt.assistant_prefix or "")
        )
    ids = ctx.encode_prompt(text)
    if prompt.assistant_prefix:  # SGLang appends the continued message's tokens after the generation prompt
        ids += ctx.tokenizer.encode(prompt.assistant_prefix)
    return ids


async def chat_completions(request: Request) -> Response:
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
        ids = await asyncio.to_thread(_chat_prompt, ctx, prompt, opts)
        prepared = fan_out([_prepare(ctx, body, ids, ("max_completion_tokens", "max_tokens"), chat=True)])
        if opts.parses_tools:  # SGLang keeps special tokens then: call markers often are special tokens
            for p in prepared:
                p.skip_special_tokens = False
        await ctx.compile_grammars(prepared)  # structured output; a bad grammar is a 400
    except (RequestValueError, ContractError) as e:
        return error_response(str(e))
    return await _serve(ctx, request, body, prepared, chat=opts)


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
    chat: ChatOptions | None,
) -> Response:
    try:
        group, states = start_group(ctx, prepared)
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
