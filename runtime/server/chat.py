"""Chat requests beyond plain messages, as SGLang 0.5.23's serving_chat.py handles them.

In: `tools` and `tool_choice` (passed to the chat template; `required` / named constrain the output to a JSON
array of calls), `chat_template_kwargs` (template variables such as `enable_thinking`), `continue_final_message`
(the last assistant message is continued, not closed), `separate_reasoning` / `stream_reasoning`.
Out: the assistant message (`content`, `reasoning_content`, `tool_calls`) and the streamed deltas, split by the
server's `--reasoning-parser` and `--tool-call-parser`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runtime.server.generate_request import RequestValueError, short_repr
from runtime.server.reasoning import ReasoningParser
from runtime.server.tool_calls import (
    ToolCall,
    ToolCallParser,
    ToolCallStream,
    check_tool_choice,
    check_tools,
    tool_call_schema,
)


@dataclass
class ChatOptions:
    """A chat request's output handling, decided when its prompt is built."""

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "none"
    starts_in_reasoning: bool = False
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    constraint: dict[str, Any] | None = None  # the JSON schema a required / named tool_choice asks for

    @property
    def forced_tools(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, dict)

    @property
    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none" and (self.forced_tools or self.tool_parser is not None)


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestValueError(f"{key} must be a boolean, got {short_repr(value)}")
    return value


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages, checked and normalized for the chat template (whose own errors are not the
    client's to read as a 500): roles are strings, content is text, text parts, or null (a tool-call turn)."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestValueError("messages must be a non-empty list of {role, content} objects")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise RequestValueError(f"messages[{i}].role must be a non-empty string, got {short_repr(role)}")
        content = m.get("content")
        if content is None:  # OpenAI's assistant turn with tool_calls and no text
            content = ""
        elif isinstance(content, list):  # OpenAI content parts: only text is understood here
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise RequestValueError("only text content parts are supported by the bundled runtime")
            if any(not isinstance(p.get("text", ""), str) for p in content):
                raise RequestValueError(f"messages[{i}].content: a text part's text must be a string")
            content = "".join(p.get("text", "") for p in content)
        elif not isinstance(content, str):
            raise RequestValueError(
                f"messages[{i}].content must be a string, a list of text parts, or null; got {short_repr(content)}"
            )
        message = {**m, "content": content}
        for call in message.get("tool_calls") or []:  # templates read arguments as a mapping (Qwen3's does)
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except json.JSONDecodeError:
                    pass
        out.append(message)
    return out


@dataclass
class ChatPrompt:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # what the template sees
    template_kwargs: dict[str, Any]
    assistant_prefix: str | None  # continue_final_message: appended after the generation prompt


def chat_prompt_and_options(
    body: dict[str, Any], tool_parser: str | None, reasoning_parser: str | None
) -> tuple[ChatPrompt, ChatOptions]:
    """Check a chat body's tools / reasoning fields; what to render and how to read the output."""
    messages = check_messages(body.get("messages"))
    try:
        tools = check_tools(body["tools"]) if body.get("tools") is not None else []
        choice = check_tool_choice(body.get("tool_choice"), tools)
    except ValueError as e:
        raise RequestValueError(str(e)) from None
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise RequestValueError(f"chat_template_kwargs must be an object, got {short_repr(kwargs)}")
    prefix = None
    continue_final = _bool(body, "continue_final_message", False)
    if messages[-1]["role"] == "assistant":  # SGLang: continue it, or read it as the user's turn
        if continue_final:
            prefix = messages.pop()["content"]
        else:
            messages[-1] = {"role": "user", "content": messages[-1]["content"]}
    opts = ChatOptions(
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        tools=tools,
        tool_choice=choice,
        separate_reasoning=_bool(body, "separate_reasoning", True),
        stream_reasoning=_bool(body, "stream_reasoning", True),
    )
    shown: list[dict[str, Any]] | None = None
    if tools and choice != "none":
        shown = (
            tools
            if not isinstance(choice, dict)
            else [t for t in tools if t["function"]["name"] == choice["function"]["name"]]
        )
        if opts.forced_tools:
            parallel = _bool(body, "parallel_tool_calls", True)
            opts.constraint = tool_call_schema(tools, choice, parallel)
    if not messages:
        raise RequestValueError("continue_final_message needs a message before the assistant one")
    return ChatPrompt(messages, shown, dict(kwargs or {}), prefix), opts


def _tool_call_json(call: ToolCall, index: int) -> dict[str, Any]:
    return {"id": call.id, "index": index, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip


class ChatOutput:
    """One choice's text turned into the assistant message, whole or as stream deltas."""

    def __init__(self, opts: ChatOptions) -> None:
        self.opts = opts
        self._reasoning = (
            ReasoningParser(opts.reasoning_parser, opts.starts_in_reasoning)
            if opts.reasoning_parser and opts.separate_reasoning
            else None
        )
        parser = ToolCallParser(opts.tool_parser, opts.tools) if opts.tool_parser and opts.parses_tools else None
        self._tools = parser
        self._stream = ToolCallStream(parser) if parser is not None and not opts.forced_tools else None
        self._forced_text = ""  # required / named: the JSON array is parsed once complete
        self._held_reasoning = ""  # stream_reasoning=false: sent in one delta at the end
        self._calls_sent = 0
        self.called = False

    def _forced_calls(self, text: str) -> tuple[str, list[ToolCall]]:
        """required / named: the JSON array the constraint produces; the server's own format as a fallback
        (a model that answers in its native call syntax, when no grammar engine holds it to the array)."""
        parser = self._tools or ToolCallParser("qwen25", self.opts.tools)
        calls = parser.parse_json_array(text.strip())
        if calls is not None:
            content = ""
        else:
            content, calls = parser.parse(text)
        choice = self.opts.tool_choice
        if isinstance(choice, dict):
            calls = [c for c in calls if c.name == choice["function"]["name"]]
        return content, calls

    def message(self, text: str) -> dict[str, Any]:
        reasoning = None
        if self._reasoning is not None:
            reasoning, text = self._reasoning.parse(text)
        calls: list[ToolCall] = []
        if self.opts.parses_tools and self.opts.forced_tools:
            text, calls = self._forced_calls(text)
        elif self._tools is not None:
            text, calls = self._tools.parse(text)
        self.called = bool(calls)
        return {
            "role": "assistant",
            "content": text if text or not calls else None,
            "reasoning_content": reasoning,
            "tool_calls": [_tool_call_json(c, i) for i, c in enumerate(calls)] or None,
        }

    def deltas(self, text: str, final: bool) -> list[dict[str, Any]]:
        """The deltas for the next piece of text (`final`: generation ended; flush what was held back)."""
        reasoning, content = "", text
        if self._reasoning is not None:
            reasoning, content = self._reasoning.feed(text)
            if final:
                more_r, more_c = self._reasoning.finish()
                reasoning, content = reasoning + more_r, content + more_c
        out: list[dict[str, Any]] = []
        if reasoning and self.opts.stream_reasoning:
            out.append({"reasoning_content": reasoning})
        elif reasoning:
            self._held_reasoning += reasoning
        if final and self._held_reasoning:
            out.append({"reasoning_content": self._held_reasoning})
        calls: list[ToolCall] = []
        if self.opts.parses_tools and self.opts.forced_tools:
            self._forced_text += content
            content = ""
            if final:
                content, calls = self._forced_calls(self._forced_text)
        elif self._stream is not None:
            content, calls = self._stream.feed(content)
            if final:
                content += self._stream.finish()
        if content:
            out.append({"content": content})
        for call in calls:
            index = self._next_index()
            out.append({"tool_calls": [{"id": call.id, "index": index, "type": "function",
                                        "function": {"name": call.name, "arguments": ""}}]})  # fmt: skip
            out.append({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})
        return out

    def _next_index(self) -> int:
        index = self._calls_sent
        self._calls_sent += 1
        self.called = True
        return index

    def finish_reason(self, reason: str | None) -> str | None:
        """SGLang: a stop that ended a response with tool calls is reported as `tool_calls`."""
        return "tool_calls" if reason == "stop" and self.called else reason
