"""Parsing and checking a `/generate` body the way SGLang 0.5.23 does, into engine requests.

SGLang refuses an unknown sampling parameter with serde's text ("unknown field `x`, expected one of ...")
and a wrong JSON type with "invalid type: ..., expected ...". Parameters SGLang has but the runtime does not
implement are accepted only at their neutral value; anything else is refused by name, never ignored.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from runtime.core.requests import GenerateRequest, SamplingError, SamplingParams, prompt_problem, short_repr

# SGLang 0.5.23's sampling-parameter fields, in its order (api/v1/api_types.py _FIELDS_SamplingParams).
SGLANG_SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
    "watermark", "choice",
)  # fmt: skip

# Accepted only at these values: the runtime has no grammars, beams or watermarks.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "stop_regex": (None, "", []),
    "structural_tag": (None, ""),
    "custom_params": (None, {}),
    "beam_width": (None, 1),
    "watermark": (None,),
    "choice": (None, []),
}


class ContractError(ValueError):
    """The body breaks SGLang's JSON contract (SGLang answers `{"error": "<text>"}` with 400)."""


class RequestValueError(ValueError):
    """Well-formed but cannot be served (SGLang answers `{"error": {"message": ...}}` with 400)."""


def _unexpected(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, list):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return type(v).__name__


def _invalid(key: str, v: Any, expected: str) -> ContractError:
    return ContractError(f"{key}: invalid type: {_unexpected(v)}, expected {expected}")


def _number(key: str, v: Any) -> float | int | None:
    """A JSON number as a float; its range (finite included) is SamplingParams' to check."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _invalid(key, v, "f32")
    try:
        return float(v)
    except OverflowError:  # an integer too large for a float: SamplingParams refuses it as not finite
        return v


def _integer(key: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _invalid(key, v, "i64")
    return v


def _boolean(key: str, v: Any) -> bool | None:
    if v is None:
        return None
    if not isinstance(v, bool):
        raise _invalid(key, v, "a boolean")
    return v


def _strings(key: str, v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return list(v)
    raise _invalid(key, v, "a string or a sequence of strings")


def is_token_ids(v: Any) -> TypeGuard[list[int]]:
    """A list of JSON integers (booleans are not). Types are collected in C (`map`, `set`): a 2048-id prompt in
    ~20 us instead of ~150 for an isinstance check per id."""
    return isinstance(v, list) and set(map(type, v)) <= {int}


# Token ids checked on the event loop up to this many in one request (~1 ms); more go to a worker thread, as
# texts (tokenized) always do, so one huge body never holds the loop.
INLINE_CHECK_IDS = 16384


def checked_inline(prompt: Any) -> bool:
    """Whether a request's prompt is checked on the event loop rather than on a worker thread: token ids (a list,
    or a batch of lists) need no tokenizer, and up to INLINE_CHECK_IDS of them cost less than the hop to a thread
    and back (~1 ms of time to first token). Anything else not a text is refused at once."""
    if isinstance(prompt, str):
        return False
    if not isinstance(prompt, list):
        return True
    if prompt and not isinstance(prompt[0], str | list):  # flat ids (or refused without tokenizing)
        return len(prompt) <= INLINE_CHECK_IDS
    if any(isinstance(p, str) for p in prompt):
        return False
    return sum(len(p) for p in prompt if isinstance(p, list)) <= INLINE_CHECK_IDS


def _token_ids(key: str, v: Any) -> list[int]:
    if v is None:
        return []
    if is_token_ids(v):
        return list(v)
    raise _invalid(key, v, "a sequence of integers")


@dataclass
class ParsedSampling:
    sampling: SamplingParams
    max_new_tokens_given: bool  # False: SGLang's default 128 (or the context budget if smaller)
    skip_special_tokens: bool
    no_stop_trim: bool
    stream_interval: int = 1
    n: int = 1  # continuations per prompt (runtime/server/fanout.py)
    constraint: tuple[str, str] | None = None  # (json_schema | regex | ebnf, its text): structured output


def _constraint(raw: dict[str, Any], name: Any) -> tuple[str, str] | None:
    """SGLang's structured-output fields: at most one; an empty string is unset (as its `x or None`)."""
    found: list[tuple[str, str]] = []
    for key in ("json_schema", "regex", "ebnf"):
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise _invalid(name(key), value, "a string")
        if value:
            found.append((key, value))
    if len(found) + bool(raw.get("structural_tag")) > 1:
        raise RequestValueError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
    return found[0] if found else None


def parse_sampling_params(raw: Any, names: Mapping[str, str] | None = None) -> ParsedSampling:
    """Parse SGLang's sampling parameters; `names` maps a field to the name the client sent it as (the OpenAI
    routes: `max_tokens` for max_new_tokens, `seed` for sampling_seed), so every error names what was sent."""
    spelled = names or {}

    def name(key: str) -> str:
        return spelled.get(key, key)

    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ContractError(f"sampling_params: invalid type: {_unexpected(raw)}, expected struct SamplingParams")
    for key in raw:
        if key not in SGLANG_SAMPLING_FIELDS:
            listed = ", ".join(f"`{f}`" for f in SGLANG_SAMPLING_FIELDS)
            raise ContractError(f"unknown field `{key}`, expected one of {listed}")
    for key, allowed in _NEUTRAL.items():
        if key in raw and raw[key] not in allowed:
            label = spelled[key] if key in spelled else f"sampling_params.{key}"
            raise RequestValueError(
                f"{label}={short_repr(raw[key])} is not implemented by the bundled runtime "
                f"(accepted: {', '.join(repr(a) for a in allowed if a is not None) or 'null'})"
            )
    values: dict[str, Any] = {
        "temperature": _number(name("temperature"), raw.get("temperature")),
        "top_p": _number(name("top_p"), raw.get("top_p")),
        "top_k": _integer(name("top_k"), raw.get("top_k")),
        "min_p": _number(name("min_p"), raw.get("min_p")),
        "max_new_tokens": _integer(name("max_new_tokens"), raw.get("max_new_tokens")),
        "stop": _strings(name("stop"), raw.get("stop")),
        "stop_token_ids": _token_ids(name("stop_token_ids"), raw.get("stop_token_ids")),
        "ignore_eos": bool(_boolean(name("ignore_eos"), raw.get("ignore_eos"))),
        "seed": _integer(name("sampling_seed"), raw.get("sampling_seed")),
        "frequency_penalty": _number(name("frequency_penalty"), raw.get("frequency_penalty")),
        "presence_penalty": _number(name("presence_penalty"), raw.get("presence_penalty")),
        "repetition_penalty": _number(name("repetition_penalty"), raw.get("repetition_penalty")),
        "min_new_tokens": _integer(name("min_new_tokens"), raw.get("min_new_tokens")),
        "logit_bias": _logit_bias(raw.get("logit_bias"), name),
    }
    if values["top_k"] is not None and values["top_k"] >= 1 << 30:
        values["top_k"] = -1  # SGLang's TOP_K_ALL means "whole vocabulary"
    given = {key: value for key, value in values.items() if value is not None}
    try:
        p = SamplingParams(**given, spelled={**spelled, "seed": name("sampling_seed")})
    except SamplingError as exc:
        raise RequestValueError(str(exc)) from None
    n = _integer(name("n"), raw.get("n"))
    if n is not None and not 1 <= n <= MAX_N:
        raise RequestValueError(f"{name('n')} must be in [1, {MAX_N}], got {short_repr(n)}")
    interval = _integer(name("stream_interval"), raw.get("stream_interval"))
    _boolean(name("spaces_between_special_tokens"), raw.get("spaces_between_special_tokens"))
    skip = _boolean(name("skip_special_tokens"), raw.get("skip_special_tokens"))
    no_trim = _boolean(name("no_stop_trim"), raw.get("no_stop_trim"))
    return ParsedSampling(
        sampling=p,
        max_new_tokens_given="max_new_tokens" in raw and raw["max_new_tokens"] is not None,
        skip_special_tokens=True if skip is None else skip,
        no_stop_trim=bool(no_trim),
        # As SGLang: unset or 0 takes the server default (1); a negative one streams every step too.
        stream_interval=interval if interval is not None and interval > 0 else 1,
        n=1 if n is None else n,
        constraint=_constraint(raw, name),
    )


MAX_N = 128  # continuations per prompt: SGLang sets no limit, but a request must not fill the engine by itself


def _logit_bias(bias: Any, name: Callable[[str], str]) -> dict[int, float | int] | None:
    """SGLang's logit_bias: token id (an integer as a string) -> bias. Its keys are checked against the
    vocabulary in prepare_request, its values' range by SamplingParams."""
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise _invalid(name("logit_bias"), bias, "a map of token id to bias")
    out: dict[int, float | int] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise RequestValueError(
                f"{name('logit_bias')} keys must be token ids (integers as strings), got {short_repr(key)}"
            ) from None
        number = _number(f"{name('logit_bias')}[{key}]", value)
        if number is not None:
            out[token] = number  # "1" and "01" are one token: the last value wins, as in SGLang
    return out


@dataclass
class PreparedRequest:
    """One engine request plus what the server needs to render its answer."""

    index: int
    request: GenerateRequest
    skip_special_tokens: bool
    no_stop_trim: bool
    stream_interval: int = 1  # streamed: a chunk at the first token, then once this many tokens are unsent
    n: int = 1  # continuations of this prompt (sampling_params.n / OpenAI n); fanout.py expands them
    constraint: tuple[str, str] | None = None  # compiled into request.grammar by runtime/server/structured.py
    return_text_in_logprobs: bool = False


def _prompts(body: dict[str, Any], encode: Any) -> tuple[list[list[int]], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is None and input_ids is None:
        raise RequestValueError("Either text, input_ids or input_embeds should be provided.")
    if text is not None and input_ids is not None:
        raise RequestValueError("Give either text or input_ids, not both.")
    if text is not None:
        if isinstance(text, str):
            return [encode(text)], True
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [encode(t) for t in text], False
        raise ContractError(f"text: invalid type: {_unexpected(text)}, expected a string or a list of strings")
    if isinstance(input_ids, list) and not input_ids:
        raise RequestValueError("input_ids cannot be empty.")
    if is_token_ids(input_ids):
        return [list(input_ids)], True
    if isinstance(input_ids, list) and all(isinstance(row, list) for row in input_ids):
        return [_token_ids("input_ids", row) for row in input_ids], False
    raise ContractError(
        f"input_ids: invalid type: {_unexpected(input_ids)}, expected a list of token ids or a list of lists"
    )


def parse_generate_body(
    body: Any, *, encode: Any, vocab_size: int, context_len: int
) -> tuple[list[PreparedRequest], bool, bool]:
    """(requests, is_single, stream) from a /generate body; raises ContractError or RequestValueError."""
    if not isinstance(body, dict):
        raise ContractError(f"invalid type: {_unexpected(body)}, expected struct GenerateRequest")
    stream = _boolean("stream", body.get("stream")) or False
    prompts, single = _prompts(body, encode)
    logprob_fields = _logprob_fields(body, len(prompts))
    raw_params = body.get("sampling_params")
    if isinstance(raw_params, list):
        if len(raw_params) != len(prompts):
            raise RequestValueError(
                f"sampling_params has {len(raw_params)} entries for a batch of {len(prompts)} prompts"
            )
        params = [parse_sampling_params(r) for r in raw_params]
    else:
        params = [parse_sampling_params(raw_params)] * len(prompts)
    rid = body.get("rid")
    if rid is None:
        rids = [uuid.uuid4().hex for _ in prompts]
    elif single and isinstance(rid, str):
        rids = [rid]
    elif not single and isinstance(rid, list) and len(rid) == len(prompts) and all(isinstance(r, str) for r in rid):
        rids = list(rid)
    else:
        raise RequestValueError("rid must be a string for one prompt, or a list of strings, one per prompt")
    if len(set(rids)) != len(rids):
        raise RequestValueError(f"Duplicate request ID detected: {rids}")
    out: list[PreparedRequest] = []
    for i, (ids, ps, r) in enumerate(zip(prompts, params, rids, strict=True)):
        prepared = prepare_request(i, ids, ps, r, stream, vocab_size, context_len)
        apply_logprob_fields(prepared, *logprob_fields[i])
        apply_bootstrap_fields(body, prepared.request, single)
        out.append(prepared)
    return out, single, stream


def _per_prompt(body: dict[str, Any], key: str, n: int, parse: Any, default: Any) -> list[Any]:
    """A /generate field given once or as a list with one value per prompt (SGLang's batch form)."""
    value = body.get(key)
    if isinstance(value, list):
        if len(value) != n:
            raise RequestValueError(f"{key} has {len(value)} entries for a batch of {n} prompts")
        return [default if (v := parse(key, item)) is None else v for item in value]
    parsed = parse(key, value)
    return [default if parsed is None else parsed] * n


def _logprob_fields(body: dict[str, Any], n: int) -> list[tuple[bool, int, int, bool]]:
    """(return_logprob, top_logprobs_num, logprob_start_len, return_text_in_logprobs) per prompt."""
    columns = [
        _per_prompt(body, "return_logprob", n, _boolean, False),
        _per_prompt(body, "top_logprobs_num", n, _integer, 0),
        _per_prompt(body, "logprob_start_len", n, _integer, -1),
        _per_prompt(body, "return_text_in_logprobs", n, _boolean, False),
    ]
    for top in columns[1]:
        if top < 0:
            raise RequestValueError(f"top_logprobs_num must be >= 0, got {short_repr(top)}")
    for start in columns[2]:
        if start < -1:
            raise RequestValueError(f"logprob_start_len must be >= -1, got {short_repr(start)}")
    return list(zip(*columns, strict=True))


def apply_logprob_fields(
    prepared: PreparedRequest, return_logprob: bool, top: int, start: int, with_text: bool
) -> None:
    """Logprob options onto one request; a start past its prompt is refused with SGLang's message."""
    request = prepared.request
    if return_logprob and start > len(request.input_ids):
        raise RequestValueError(
            f"req.logprob_start_len={start} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={len(request.input_ids)}. Please use a smaller logprob_start_len."
        )
    request.return_logprob = return_logprob
    request.top_logprobs_num = top if return_logprob else 0
    request.logprob_start_len = start if return_logprob else -1
    prepared.return_text_in_logprobs = with_text


def apply_bootstrap_fields(body: dict[str, Any], request: GenerateRequest, single: bool) -> None:
    """PD disaggregation's routing fields (SGLang's names): where decode fetches the prompt's KV."""
    host, port, room = body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")
    if host is None and port is None and room is None:
        return
    if not single:
        raise RequestValueError("bootstrap_host/port/room: the bundled runtime takes them for one prompt")
    if host is not None and not isinstance(host, str):
        raise _invalid("bootstrap_host", host, "a string")
    request.bootstrap_host = host
    request.bootstrap_port = _integer("bootstrap_port", port)
    if request.bootstrap_port is not None and not 0 < request.bootstrap_port < 65536:
        raise RequestValueError(f"bootstrap_port must be in 1..65535, got {short_repr(request.bootstrap_port)}")
    request.bootstrap_room = _integer("bootstrap_room", room)
    if request.bootstrap_room is not None and not 0 <= request.bootstrap_room < 1 << 63:
        raise RequestValueError(f"bootstrap_room must be in 0..2^63-1, got {short_repr(request.bootstrap_room)}")


def prepare_request(
    index: int,
    ids: list[int],
    ps: ParsedSampling,
    rid: str,
    stream: bool,
    vocab_size: int,
    context_len: int,
    max_tokens_name: str = "max_new_tokens",
) -> PreparedRequest:
    problem = prompt_problem(ids, context_len)
    if problem is not None:
        raise RequestValueError(problem)
    if min(ids) < 0 or max(ids) >= vocab_size:  # min/max in C; the list of offenders only for the message
        bad = [t for t in ids if not 0 <= t < vocab_size]
        raise RequestValueError(f"input_ids has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    sampling = copy.copy(ps.sampling)  # checked when parsed; a batch shares one ParsedSampling
    sampling.logit_bias = dict(sampling.logit_bias)
    problem = sampling.vocab_problem(vocab_size)
    if problem is not None:
        raise RequestValueError(problem)
    budget = context_len - len(ids)
    if sampling.max_new_tokens > budget:
        if ps.max_new_tokens_given:
            raise RequestValueError(
                f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
                f"You requested a total of {len(ids) + sampling.max_new_tokens} tokens: {len(ids)} tokens "
                f"from the input messages and {sampling.max_new_tokens} tokens for the completion "
                f"({max_tokens_name}). Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            )
        sampling.max_new_tokens = budget
    # As SGLang when the context budget clips max_new_tokens below it (SamplingParams checked the rest).
    sampling.min_new_tokens = min(sampling.min_new_tokens, sampling.max_new_tokens)
    request = GenerateRequest(rid=rid, input_ids=ids, sampling=sampling, stream=stream)
    return PreparedRequest(
        index, request, ps.skip_special_tokens, ps.no_stop_trim, ps.stream_interval, ps.n, constraint=ps.constraint
    )
