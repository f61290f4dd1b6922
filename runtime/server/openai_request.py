"""An OpenAI request body (/v1/completions, /v1/chat/completions) as the engine requests it asks for.

Apart from the routes (runtime/server/openai_api.py), which serve the answers: this side only reads the body and
goes through /generate's one parser of sampling parameters (runtime/server/generate_request.py).
"""

from __future__ import annotations

import uuid
from typing import Any

from runtime.server.chat import ChatOptions, ChatPrompt
from runtime.server.context import ServerContext
from runtime.server.generate_request import (
    PreparedRequest,
    RequestValueError,
    apply_bootstrap_fields,
    apply_logprob_fields,
    is_token_ids,
    parse_sampling_params,
    prepare_request,
    short_repr,
)
from runtime.server.reasoning import ReasoningParser
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


def prepare_openai(
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


def completion_prompts(ctx: ServerContext, prompt: Any) -> list[list[int]]:
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


def chat_prompt_ids(ctx: ServerContext, prompt: ChatPrompt, opts: ChatOptions) -> list[int]:
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
