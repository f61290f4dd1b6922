"""Tools and reasoning through the real `openai` client against a real server (--tool-call-parser qwen25,
--reasoning-parser qwen3) running the scripted Qwen3-Next: its greedy output is a think block and a tool call,
or a plain answer with enable_thinking=false (tests/runtime/scripted_model.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.runtime.conftest import RunningServer, start_runtime_server
from tests.runtime.scripted_model import (
    ANSWER,
    CALL_JSON,
    CONTINUATION,
    PREFIX,
    REASONING,
    build_scripted_model,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = ("get_weather", {"city": "Paris", "days": 3})
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    model = build_scripted_model(tmp_path_factory.mktemp("scripted") / "model")
    with start_runtime_server(
        model, "--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3", "--memory-budget-gib", "1"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _create(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(model="scripted", temperature=0, max_tokens=32, **kwargs)


def _calls(message: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_auto_tool_call_with_reasoning(client: openai.OpenAI) -> None:
    choice = _create(client, messages=ASK, tools=TOOLS).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert _calls(choice.message) == [CALL]
    assert choice.message.tool_calls[0].id.startswith("call_") and choice.message.tool_calls[0].type == "function"
    assert choice.message.reasoning_content == REASONING
    assert not choice.message.content  # the call's markup never shows up as text


def _collect_stream(chunks: list[Any]) -> tuple[str, str, list[tuple[str, dict[str, Any]]], str | None]:
    reasoning = content = ""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": "", "id": None})
            entry["id"] = entry["id"] or call.id
            if call.function and call.function.name:
                entry["name"] += call.function.name
            if call.function and call.function.arguments:
                entry["arguments"] += call.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert all(c["id"] for c in calls.values()), "each streamed call carries an id in its first delta"
    parsed = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]
    return reasoning, content, parsed, finish


def test_streamed_tool_call_deltas_async(server: RunningServer) -> None:
    async def run() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as aclient:
            stream = await aclient.chat.completions.create(
                model="scripted", messages=ASK, tools=TOOLS, temperature=0, max_tokens=32, stream=True
            )
            return [chunk async for chunk in stream]

    reasoning, content, calls, finish = _collect_stream(asyncio.run(run()))
    assert (reasoning, content, calls, finish) == (REASONING, "", [CALL], "tool_calls")


def test_async_non_stream_and_sync_stream_agree(client: openai.OpenAI, server: RunningServer) -> None:
    async def run() -> Any:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as aclient:
            return await aclient.chat.completions.create(
                model="scripted", messages=ASK, tools=TOOLS, temperature=0, max_tokens=32
            )

    message = asyncio.run(run()).choices[0].message
    streamed = _collect_stream(list(_create(client, messages=ASK, tools=TOOLS, stream=True)))
    assert (message.reasoning_content, message.content or "", _calls(message), "tool_calls") == streamed


def test_enable_thinking_false_reaches_the_template(client: openai.OpenAI) -> None:
    choice = _create(client, messages=ASK, tools=TOOLS, extra_body=NO_THINK).choices[0]
    assert (choice.message.content, choice.message.reasoning_content, choice.message.tool_calls) == (ANSWER, None, None)
    assert choice.finish_reason == "stop"
    reasoning, content, calls, finish = _collect_stream(
        list(_create(client, messages=ASK, tools=TOOLS, extra_body=NO_THINK, stream=True))
    )
    assert (reasoning, content, calls, finish) == ("", ANSWER, [], "stop")


def test_tool_choice_none_hides_the_tools_and_parses_nothing(client: openai.OpenAI) -> None:
    auto = _create(client, messages=ASK, tools=TOOLS)
    none = _create(client, messages=ASK, tools=TOOLS, tool_choice="none")
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason == "stop"
    assert CALL_JSON.strip() in none.choices[0].message.content  # the raw text, unparsed
    assert none.usage.prompt_tokens < auto.usage.prompt_tokens  # the template saw no tools


def _grammar_engine(server: RunningServer) -> bool:
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1, "json_schema": '{"type": "object"}'}}
    return httpx.post(server.url + "/generate", json=body, timeout=60).status_code == 200


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_required_and_named_tool_choice(client: openai.OpenAI, server: RunningServer, tool_choice: Any) -> None:
    # With the grammar engine the output is SGLang's JSON array of calls from the first token (the scripted model's
    # runner-up after <think>), so there is no think block; without it the model's own call syntax is parsed.
    reasoning = None if _grammar_engine(server) else REASONING
    for stream in (False, True):
        if stream:
            got_reasoning, _, calls, finish = _collect_stream(list(_create(client, messages=ASK, tools=TOOLS,
                                                              tool_choice=tool_choice, stream=True)))  # fmt: skip
            got_reasoning = got_reasoning or None
        else:
            choice = _create(client, messages=ASK, tools=TOOLS, tool_choice=tool_choice).choices[0]
            got_reasoning, calls, finish = (
                choice.message.reasoning_content,
                _calls(choice.message),
                choice.finish_reason,
            )
        assert (got_reasoning, calls, finish) == (reasoning, [CALL], "tool_calls")


def test_continue_final_message(client: openai.OpenAI) -> None:
    turn = [*ASK, {"role": "assistant", "content": PREFIX}]
    cont = _create(client, messages=turn, extra_body={**NO_THINK, "continue_final_message": True})
    assert cont.choices[0].message.content == CONTINUATION
    # Without it SGLang reads a trailing assistant message as the user's turn: a fresh answer.
    fresh = _create(client, messages=turn, extra_body=NO_THINK)
    assert fresh.choices[0].message.content == ANSWER


def test_separate_and_stream_reasoning_switches(client: openai.OpenAI) -> None:
    joined = _create(client, messages=ASK, tools=TOOLS, extra_body={"separate_reasoning": False}).choices[0]
    assert joined.message.reasoning_content is None
    assert joined.message.content == REASONING + "</think>" and _calls(joined.message) == [CALL]
    chunks = list(_create(client, messages=ASK, tools=TOOLS, stream=True, extra_body={"stream_reasoning": False}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    pieces = [r for d in deltas if (r := getattr(d, "reasoning_content", None))]
    assert pieces == [REASONING]  # held back, then sent whole


def test_a_tool_result_turn_renders(client: openai.OpenAI) -> None:
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip
    choice = _create(client, messages=history, tools=TOOLS, extra_body=NO_THINK).choices[0]
    assert choice.message.content == ANSWER


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
        ({"tools": [{"type": "function", "function": {"name": 3}}]}, "tools[0].function.name"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        ({"continue_final_message": "yes"}, "continue_final_message"),
    ],
)
def test_bad_tool_fields_answer_400_naming_them(server: RunningServer, extra: dict[str, Any], named: str) -> None:
    body = {"model": "scripted", "messages": ASK, "max_tokens": 4, **extra}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert named in response.json()["message"]


def test_model_info_reports_the_parsers(server: RunningServer) -> None:
    info = httpx.get(server.url + "/model_info", timeout=10).json()
    assert (info["tool_call_parser"], info["reasoning_parser"]) == ("qwen25", "qwen3")


def test_the_scripted_model_is_what_the_parsers_see(server: RunningServer, tmp_path: Path) -> None:
    """The raw text of the same prompt on /generate: the markup the chat route turns into fields."""
    body = {"text": "<|im_start|>assistant\n<think>", "sampling_params": {"temperature": 0, "max_new_tokens": 16,
            "skip_special_tokens": False}}  # fmt: skip
    text = httpx.post(server.url + "/generate", json=body, timeout=30).json()["text"]
    assert text == f"{REASONING}</think><tool_call>{CALL_JSON}</tool_call>"


def test_forced_tool_choice_without_a_grammar_engine_parses_the_models_own_calls(tmp_path: Path) -> None:
    """--grammar-backend none: required / named are not constrained; the output is parsed as it comes (here the
    model's own <tool_call> syntax after its think block), and a named choice keeps only that function."""
    model = build_scripted_model(tmp_path / "model")
    flags = ("--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3", "--grammar-backend", "none",
             "--memory-budget-gib", "1")  # fmt: skip
    with start_runtime_server(model, *flags) as plain:
        assert not _grammar_engine(plain)
        client = openai.OpenAI(base_url=plain.url + "/v1", api_key="unused", max_retries=0)
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            got = _create(client, messages=ASK, tools=TOOLS, tool_choice=choice).choices[0]
            assert (got.message.reasoning_content, _calls(got.message), got.finish_reason) == (
                REASONING, [CALL], "tool_calls")  # fmt: skip
        other = {"type": "function", "function": {"name": "get_time"}}
        got = _create(client, messages=ASK, tools=TOOLS, tool_choice=other).choices[0]
        assert got.message.tool_calls is None and got.finish_reason == "stop"
