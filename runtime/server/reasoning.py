"""Reasoning parsers: split a model's `<think>` block from its answer, as SGLang 0.5.23's `--reasoning-parser`.

The names and markers are SGLang's (srt/parser/reasoning_parser.py DetectorMap); so is the behaviour: text up
to the end marker is `reasoning_content`, the rest is `content`; a model that starts thinking without writing
the start marker (it is in the prompt, or the parser always forces it) is "in reasoning" from the first token;
reasoning cut short by max_tokens stays reasoning; a tool call opened before the end marker ends the reasoning
(Qwen3.5, Nemotron 3 and Kimi K2 do that). Streaming holds back a suffix that could still become a marker.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningFormat:
    start: str
    end: str
    force: bool = False  # the model thinks from its first token (no start marker in the output)
    tool_start: str | None = None  # a tool call that implicitly closes the reasoning


_QWEN3 = ReasoningFormat("<think>", "</think>", tool_start="<tool_call>")
REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "qwen3": _QWEN3,
    "qwen3-thinking": ReasoningFormat("<think>", "</think>", force=True, tool_start="<tool_call>"),
    "deepseek-r1": ReasoningFormat("<think>", "</think>", force=True),
    "nemotron_3": ReasoningFormat("<think>", "</think>", tool_start="<tool_call>"),
    "kimi": ReasoningFormat("\u25c1think\u25b7", "\u25c1/think\u25b7"),
    "kimi_k2": ReasoningFormat("<think>", "</think>", tool_start="<|tool_calls_section_begin|>"),
}


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a strict prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """One response's reasoning split, non-streaming (`parse`) or streaming (`feed` then `finish`).

    `in_reasoning` says whether generation starts inside a think block: the parser forces it, or the prompt
    (a template that opens `<think>` in the generation prompt, or a continued assistant message) left one open.
    """

    def __init__(self, name: str, in_reasoning: bool = False) -> None:
        self.format = REASONING_FORMATS[name]
        self._in = self.format.force or in_reasoning
        self._stripped_start = False
        self._buffer = ""

    @staticmethod
    def prompt_opens_reasoning(name: str, prompt_tail: str) -> bool:
        """Whether the prompt's end leaves a think block open (e.g. Qwen3.5's generation prompt `<think>\\n`)."""
        fmt = REASONING_FORMATS[name]
        start = prompt_tail.rfind(fmt.start)
        return start != -1 and prompt_tail.find(fmt.end, start) == -1

    def parse(self, text: str) -> tuple[str | None, str]:
        """(reasoning_content or None, content) of a complete output."""
        fmt = self.format
        if not (self._in or fmt.start in text):
            return None, text
        body = text
        while body.startswith(fmt.start):
            body = body[len(fmt.start) :]
        if fmt.end in body:
            reasoning, content = body.split(fmt.end, 1)
            return reasoning or None, content
        if fmt.tool_start is not None and fmt.tool_start in body:
            cut = body.index(fmt.tool_start)
            return body[:cut] or None, body[cut:]
        return body or None, ""  # reasoning cut short: all of it is reasoning

    def feed(self, delta: str) -> tuple[str, str]:
        """(reasoning delta, content delta) for the next piece of streamed text."""
        fmt = self.format
        self._buffer += delta
        text = self._buffer
        markers = [fmt.start, fmt.end] + ([fmt.tool_start] if fmt.tool_start else [])
        if any(m != text and m.startswith(text) for m in markers):
            return "", ""  # the whole buffer may still become a marker
        if not self._stripped_start and fmt.start in text:
            text = text.replace(fmt.start, "", 1)
            self._stripped_start, self._in = True, True
        if not self._in:
            self._buffer = ""
            return "", text
        if fmt.end in text:
            cut = text.index(fmt.end)
            self._buffer, self._in = "", False
            return text[:cut], text[cut + len(fmt.end) :]
        if fmt.tool_start is not None and fmt.tool_start in text:
            cut = text.index(fmt.tool_start)
            self._buffer, self._in = "", False
            return text[:cut], text[cut:]
        hold = max(_partial_suffix(text, m) for m in markers)
        self._buffer = text[len(text) - hold :]
        return text[: len(text) - hold], ""

    def finish(self) -> tuple[str, str]:
        """What the stream held back, once generation ended."""
        rest, self._buffer = self._buffer, ""
        return (rest, "") if self._in else ("", rest)
