"""Tool-call parsers: find the calls in a model's output, as SGLang 0.5.23's `--tool-call-parser`.

Formats (SGLang's names, srt/function_call/):
- `qwen25` / `qwen` / `hermes`: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen2.5, Qwen3,
  Qwen3-Next).
- `qwen3_coder`: `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`
  (Qwen3-Coder, Qwen3.5, Nemotron 3); values are typed from the tool's JSON schema.
- `kimi_k2`: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}
  <|tool_call_end|><|tool_calls_section_end|>` (Kimi K2 / Kimi-Linear); the call id is the model's.

As SGLang: `content` is the text before the first call marker (stripped for the JSON formats); calls to a
function the request did not declare are dropped; a call left incomplete at the end is dropped. A
`tool_choice` of `required` or a named function makes the output a JSON array `[{"name", "parameters"}]`
(SGLang constrains it with a JSON schema, `tool_call_schema`), parsed by `parse_json_array`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


@dataclass(frozen=True)
class _Format:
    start: str  # the first call's marker: content is what precedes it
    block: re.Pattern[str]  # one complete call (or section)
    strip_content: bool


_QWEN25 = _Format("<tool_call>", re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL), True)
_FORMATS: dict[str, _Format] = {
    "qwen25": _QWEN25,
    "qwen": _QWEN25,
    "hermes": _QWEN25,
    "qwen3_coder": _Format("<tool_call>", re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL), False),
    "kimi_k2": _Format(
        "<|tool_calls_section_begin|>",
        re.compile(
            r"<\|tool_call_begin\|>\s*([^\s<|]+)\s*<\|tool_call_argument_begin\|>\s*(\{.*?\})\s*<\|tool_call_end\|>",
            re.DOTALL,
        ),
        False,
    ),
}
TOOL_CALL_PARSERS = tuple(_FORMATS)

_FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)
_KIMI_ID = re.compile(r"^(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)$")


def _typed(value: str, schema: dict[str, Any]) -> Any:
    """A qwen3_coder parameter's text as the JSON type its schema declares (strings stay text)."""
    kind = schema.get("type")
    if kind == "string" or (kind is None and not schema):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


class ToolCallParser:
    """The calls in one response's text, for the functions a request declared (`tools`: OpenAI's list)."""

    def __init__(self, name: str, tools: list[dict[str, Any]]) -> None:
        self.name = name
        self.format = _FORMATS[name]
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}

    def calls_in(self, block: re.Match[str]) -> list[ToolCall]:
        if self.name == "kimi_k2":
            found = _KIMI_ID.match(block.group(1))
            if found is None or found["name"] not in self.schemas:
                return []
            try:
                json.loads(block.group(2))
            except json.JSONDecodeError:
                return []
            return [ToolCall(found["name"], block.group(2), id=block.group(1))]
        if self.name == "qwen3_coder":
            calls = []
            for whole, tail in _FUNCTION.findall(block.group(1)):
                body = whole or tail
                if ">" not in body:
                    continue
                name, params = body.split(">", 1)
                props = self.schemas.get(name, {}).get("properties") or {}
                args: dict[str, Any] = {}
                for param in _PARAMETER.findall(params):
                    if ">" not in param:
                        continue
                    key, value = param.split(">", 1)
                    value = value.removeprefix("\n").removesuffix("\n")
                    args[key] = _typed(value, props.get(key) or {})
                if name in self.schemas:
                    calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False)))
            return calls
        try:
            obj = json.loads(block.group(1))
        except json.JSONDecodeError:
            return []
        return self._from_objects(obj if isinstance(obj, list) else [obj], "arguments")

    def _from_objects(self, objs: list[Any], *keys: str) -> list[ToolCall]:
        calls = []
        for obj in objs:
            if not isinstance(obj, dict) or obj.get("name") not in self.schemas:
                continue
            args: object = next((obj[k] for k in (*keys, "parameters", "arguments") if k in obj), {})
            calls.append(ToolCall(obj["name"], json.dumps(args, ensure_ascii=False)))
        return calls

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a complete output."""
        start = text.find(self.format.start)
        if start == -1:
            return text, []
        content = text[:start].strip() if self.format.strip_content else text[:start]
        calls = [c for block in self.format.block.finditer(text, start) for c in self.calls_in(block)]
        return content, calls

    def parse_json_array(self, text: str) -> list[ToolCall] | None:
        """The calls of a `required` / named tool_choice output (a JSON array, or one object); None if the
        text is not one."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        data = [data] if isinstance(data, dict) else data
        if not isinstance(data, list) or not all(isinstance(d, dict) and "name" in d for d in data):
            return None
        return self._from_objects(data, "parameters")


class ToolCallStream:
    """Streaming: content until the first call marker (a partial marker held back), then each call as it
    completes; calls are numbered in order (OpenAI's `tool_calls[].index`)."""

    def __init__(self, parser: ToolCallParser) -> None:
        self.parser = parser
        self._text = ""
        self._sent_content = 0
        self._in_calls = False
        self._scanned = 0  # where the next complete block may begin
        self.calls: list[ToolCall] = []

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        """(content delta, newly completed calls)."""
        self._text += delta
        fmt = self.parser.format
        content = ""
        if not self._in_calls:
            start = self._text.find(fmt.start, self._sent_content)
            if start == -1:
                hold = next((n for n in range(min(len(fmt.start) - 1, len(self._text)), 0, -1)
                             if fmt.start.startswith(self._text[-n:])), 0)  # fmt: skip
                end = len(self._text) - hold
                content, self._sent_content = self._text[self._sent_content : end], end
                return content, []
            content = self._text[self._sent_content : start]
            if fmt.strip_content:
                content = content.rstrip()
            self._in_calls, self._scanned = True, start
        new: list[ToolCall] = []
        for block in fmt.block.finditer(self._text, self._scanned):
            new.extend(self.parser.calls_in(block))
            self._scanned = block.end()
        self.calls.extend(new)
        return content, new

    def finish(self) -> str:
        """Content held back as a possible marker that never completed."""
        if self._in_calls:
            return ""
        rest = self._text[self._sent_content :]
        self._sent_content = len(self._text)
        return rest


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """OpenAI's `tools`, checked: a list of {"type": "function", "function": {"name", "parameters"?}}."""
    if not isinstance(tools, list):
        raise ValueError("tools must be a list of {type: function, function: {name, parameters}} objects")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ValueError(f"tools[{i}] must be {{type: 'function', function: {{name, parameters}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        out.append({"type": "function", "function": fn})
    return out


def check_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """OpenAI's `tool_choice`: none / auto / required / {type: function, function: {name}} (SGLang's default:
    auto with tools, none without)."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise ValueError("tool_choice='required' needs a non-empty tools list")
        return str(choice)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise ValueError(
            f"tool_choice must be 'none', 'auto', 'required' or {{type: 'function', function: {{name}}}}, "
            f"got {choice!r:.80}"
        )
    if name not in {t["function"]["name"] for t in tools}:
        raise ValueError(f"tool_choice names function {name!r}, which is not in tools")
    return {"type": "function", "function": {"name": name}}


def tool_call_schema(
    tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool = True
) -> dict[str, Any]:
    """The JSON schema SGLang constrains a `required` / named tool_choice with (function_call/utils.py
    get_json_schema_constraint): an array of at least one {"name", "parameters"} object."""

    def item(tool: dict[str, Any]) -> dict[str, Any]:
        fn = tool["function"]
        return {
            "type": "object",  # SGLang's item has none, which lets a bare number through a named choice
            "properties": {
                "name": {"type": "string", "enum": [fn["name"]]},
                "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
            },
            "required": ["name", "parameters"],
        }

    if isinstance(choice, dict):
        named = [t for t in tools if t["function"]["name"] == choice["function"]["name"]]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": item(named[0])}
    else:
        schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [item(t) for t in tools]}}
    if not parallel:
        schema["maxItems"] = 1
    return schema
