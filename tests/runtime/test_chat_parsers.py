"""The tool-call and reasoning parsers on the formats SGLang 0.5.23's detectors document, whole and streamed."""

from __future__ import annotations

import json
import re

import pytest

from hybridshared.flags.runtime_args import REASONING_PARSERS, TOOL_CALL_PARSERS
from hybridshared.flags.runtime_parser import parse_args
from runtime.server.reasoning import REASONING_FORMATS, ReasoningParser
from runtime.server.tool_calls import (
    TOOL_CALL_PARSERS as IMPLEMENTED_TOOL_PARSERS,
)
from runtime.server.tool_calls import (
    ToolCallParser,
    ToolCallStream,
    check_tool_choice,
    check_tools,
    tool_call_schema,
)
from tests.control.sglang_source import SKIP_REASON, SRT

TOOLS = check_tools(
    [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "object"}}}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
            "zone": {"type": "string"}}}}},
    ]
)  # fmt: skip

QWEN25 = (
    "I will check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "undeclared", "arguments": {}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
)
QWEN3_CODER = (
    "Checking"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    '<parameter=units>\n{"temp": "C"}\n</parameter>\n</function>\n</tool_call>\n'
    "<tool_call>\n<function=get_time>\n<parameter=zone>\n42\n</parameter>\n</function>\n</tool_call>"
)
KIMI_K2 = (
    "Let me look."
    "<|tool_calls_section_begin|>"
    "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris", "days": 3}<|tool_call_end|>'
    '<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"zone": "CET"}<|tool_call_end|>'
    "<|tool_calls_section_end|>"
)
EXPECTED = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "CET"})]


def _calls(calls: list) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_qwen25_format_calls_and_content() -> None:
    for name in ("qwen25", "qwen", "hermes"):
        content, calls = ToolCallParser(name, TOOLS).parse(QWEN25)
        assert content == "I will check."  # stripped, as SGLang's Qwen25Detector
        assert _calls(calls) == EXPECTED  # the undeclared function is dropped
        assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in calls)


def test_qwen3_coder_format_types_values_from_the_schema() -> None:
    content, calls = ToolCallParser("qwen3_coder", TOOLS).parse(QWEN3_CODER)
    assert content == "Checking"
    assert _calls(calls) == [
        ("get_weather", {"city": "New York", "days": 3, "units": {"temp": "C"}}),
        ("get_time", {"zone": "42"}),  # a string parameter stays a string even when it looks like a number
    ]


def test_kimi_k2_format_keeps_the_models_call_ids() -> None:
    content, calls = ToolCallParser("kimi_k2", TOOLS).parse(KIMI_K2)
    assert content == "Let me look."
    assert _calls(calls) == EXPECTED
    assert [c.id for c in calls] == ["functions.get_weather:0", "functions.get_time:1"]


def test_text_without_calls_and_incomplete_calls() -> None:
    parser = ToolCallParser("qwen25", TOOLS)
    assert parser.parse("just text") == ("just text", [])
    content, calls = parser.parse('Hi <tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert (content, calls) == ("Hi", [])  # cut off by max_tokens: no call, no half-call text
    content, calls = parser.parse('<tool_call>\n{"name": "get_weather", "arguments": {bad json}}\n</tool_call>')
    assert calls == []


@pytest.mark.parametrize(("name", "text"), [("qwen25", QWEN25), ("qwen3_coder", QWEN3_CODER), ("kimi_k2", KIMI_K2)])
@pytest.mark.parametrize("step", [1, 3, 7])
def test_streaming_gives_what_one_parse_gives(name: str, text: str, step: int) -> None:
    parser = ToolCallParser(name, TOOLS)
    whole_content, whole_calls = parser.parse(text)
    stream = ToolCallStream(parser)
    content, calls = "", []
    for i in range(0, len(text), step):
        piece, new = stream.feed(text[i : i + step])
        assert "<tool_call" not in piece and "<|tool" not in piece  # no marker leaks into content
        content += piece
        calls += new
    content += stream.finish()
    assert content.strip() == whole_content.strip()
    assert _calls(calls) == _calls(whole_calls)


def test_streaming_releases_a_held_back_partial_marker_that_was_not_one() -> None:
    stream = ToolCallStream(ToolCallParser("qwen25", TOOLS))
    assert stream.feed("a <tool") == ("a ", [])
    assert stream.feed("box") == ("<toolbox", [])
    assert stream.feed(" <to") == (" ", [])
    assert stream.finish() == "<to"


def test_json_array_of_forced_calls() -> None:
    parser = ToolCallParser("qwen25", TOOLS)
    text = json.dumps([{"name": n, "parameters": a} for n, a in EXPECTED])
    assert _calls(parser.parse_json_array(text) or []) == EXPECTED
    one = '{"name": "get_time", "parameters": {"zone": "CET"}}'
    assert _calls(parser.parse_json_array(one) or []) == EXPECTED[1:]
    assert parser.parse_json_array("not json") is None
    assert parser.parse_json_array('[{"no_name": 1}]') is None


def test_tool_call_schema_is_sglangs() -> None:
    named = tool_call_schema(TOOLS, {"type": "function", "function": {"name": "get_time"}}, parallel=False)
    assert named == {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "object",
        "properties": {"name": {"type": "string", "enum": ["get_time"]},
                       "parameters": TOOLS[1]["function"]["parameters"]},
        "required": ["name", "parameters"]}}  # fmt: skip
    required = tool_call_schema(TOOLS, "required")
    assert [b["properties"]["name"]["enum"] for b in required["items"]["anyOf"]] == [["get_weather"], ["get_time"]]
    assert "maxItems" not in required


def test_tool_and_choice_checks_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"tools\[0\]\.function\.name"):
        check_tools([{"type": "function", "function": {"name": ""}}])
    with pytest.raises(ValueError, match=r"tools\[1\]"):
        check_tools([TOOLS[0], {"type": "retrieval"}])
    with pytest.raises(ValueError, match="'nope', which is not in tools"):
        check_tool_choice({"type": "function", "function": {"name": "nope"}}, TOOLS)
    with pytest.raises(ValueError, match="required"):
        check_tool_choice("required", [])
    assert check_tool_choice(None, TOOLS) == "auto" and check_tool_choice(None, []) == "none"


REASONING_CASES = [
    # (parser, starts in reasoning, text, expected (reasoning, content))
    ("qwen3", False, "<think>Hmm, 6*7.</think>The answer is 42.", ("Hmm, 6*7.", "The answer is 42.")),
    ("qwen3", False, "No thinking here.", (None, "No thinking here.")),
    ("qwen3", True, "Hmm, 6*7.</think>42", ("Hmm, 6*7.", "42")),  # <think> was in the prompt
    ("qwen3", True, "Still thinking when cut", ("Still thinking when cut", "")),
    ("qwen3", True, "Call it.<tool_call>{}</tool_call>", ("Call it.", "<tool_call>{}</tool_call>")),
    ("qwen3-thinking", False, "Hmm.</think>42", ("Hmm.", "42")),
    ("deepseek-r1", False, "Hmm.</think>42", ("Hmm.", "42")),
    ("deepseek-r1", False, "<think>Hmm.</think>42", ("Hmm.", "42")),
    ("nemotron_3", False, "<think>Plan.</think>Done.", ("Plan.", "Done.")),
    ("kimi", False, "\u25c1think\u25b7Plan.\u25c1/think\u25b7Done.", ("Plan.", "Done.")),
    ("kimi_k2", True, "Plan.<|tool_calls_section_begin|>x", ("Plan.", "<|tool_calls_section_begin|>x")),
]  # fmt: skip


@pytest.mark.parametrize(("name", "start", "text", "expected"), REASONING_CASES)
def test_reasoning_split(name: str, start: bool, text: str, expected: tuple[str | None, str]) -> None:
    assert ReasoningParser(name, start).parse(text) == expected


@pytest.mark.parametrize(("name", "start", "text", "expected"), REASONING_CASES)
@pytest.mark.parametrize("step", [1, 2, 5])
def test_reasoning_streamed_gives_the_same_split(
    name: str, start: bool, text: str, expected: tuple[str | None, str], step: int
) -> None:
    parser = ReasoningParser(name, start)
    reasoning = content = ""
    for i in range(0, len(text), step):
        r, c = parser.feed(text[i : i + step])
        reasoning, content = reasoning + r, content + c
        fmt = REASONING_FORMATS[name]
        assert fmt.start not in reasoning + content and fmt.end not in reasoning + content
    r, c = parser.finish()
    assert (reasoning + r or None, content + c) == expected


def test_prompt_opens_reasoning() -> None:
    assert ReasoningParser.prompt_opens_reasoning("qwen3", "<|im_start|>assistant\n<think>\n")
    assert not ReasoningParser.prompt_opens_reasoning("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not ReasoningParser.prompt_opens_reasoning("qwen3", "<|im_start|>assistant\n")


def test_the_flags_offer_exactly_the_implemented_parsers() -> None:
    assert set(TOOL_CALL_PARSERS) == set(IMPLEMENTED_TOOL_PARSERS)
    assert set(REASONING_PARSERS) == set(REASONING_FORMATS)
    args = parse_args(["--model-path", "m", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3"])
    assert (args.tool_call_parser, args.reasoning_parser) == ("qwen3_coder", "qwen3")
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "m", "--tool-call-parser", "llama3"])  # SGLang has it; the runtime does not


@pytest.mark.sglang
def test_names_and_markers_are_sglangs_own() -> None:
    """Guard against drift: every parser name is registered in SGLang 0.5.23 and every marker is in its source."""
    if not SRT.is_dir():
        pytest.skip(SKIP_REASON)
    tool_names = (SRT / "function_call/parser_names.py").read_text()
    reasoning_names = (SRT / "parser/reasoning_parser_names.py").read_text()
    assert all(f'"{n}"' in tool_names for n in IMPLEMENTED_TOOL_PARSERS)
    assert all(f'"{n}"' in reasoning_names for n in REASONING_FORMATS)
    reasoning_src = (SRT / "parser/reasoning_parser.py").read_text()
    for fmt in REASONING_FORMATS.values():
        assert f'"{fmt.start}"' in reasoning_src and f'"{fmt.end}"' in reasoning_src
    assert '"<tool_call>\\n"' in (SRT / "function_call/qwen25_detector.py").read_text()
    coder = (SRT / "function_call/qwen3_coder_detector.py").read_text()
    assert '"<function="' in coder or "<function=" in coder
    kimi = (SRT / "function_call/kimik2_detector.py").read_text()
    for marker in ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>"):
        assert marker in kimi
    utils = (SRT / "function_call/utils.py").read_text()
    assert '"minItems": 1' in utils and '"enum": [tool.function.name]' in utils
