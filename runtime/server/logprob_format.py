"""One request's log probabilities as the server renders them: SGLang's `meta_info` triples and OpenAI's shapes.

SGLang's items are `[logprob, token_id, text]` (text only with `return_text_in_logprobs`, the token decoded
alone with special tokens kept); top rows are lists of such items, or None (the first prompt position). Rendering
is incremental: a streamed chunk re-sends the cumulative lists, and only new tokens are decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.core.requests import RequestOutput
from runtime.server.tokenizer import ServerTokenizer

Item = list[Any]  # [logprob | None, token_id, text | None]
TopRow = list[tuple[float | None, int]]


@dataclass
class LogprobView:
    tokenizer: ServerTokenizer
    with_text: bool
    top_n: int
    input_items: list[Item] = field(default_factory=list)
    input_top: list[list[Item] | None] = field(default_factory=list)
    output_items: list[Item] = field(default_factory=list)
    output_top: list[list[Item] | None] = field(default_factory=list)
    _texts: dict[int, str] = field(default_factory=dict)

    def token_text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return text

    def _item(self, logprob: float | None, token: int) -> Item:
        return [logprob, token, self.token_text(token) if self.with_text else None]

    def _top(self, row: TopRow | None) -> list[Item] | None:
        return None if row is None else [self._item(v, t) for v, t in row]

    def update(self, out: RequestOutput, prompt_ids: list[int], start: int) -> None:
        if out.input_token_logprobs is not None:
            ids = prompt_ids[start:]
            self.input_items = [self._item(v, t) for v, t in zip(out.input_token_logprobs, ids, strict=False)]
            if self.top_n > 0 and out.input_top_logprobs is not None:
                self.input_top = [self._top(row) for row in out.input_top_logprobs]
        if out.new_token_logprobs is not None:
            ids = out.new_token_ids[: len(out.new_token_logprobs)]
            self.output_items.extend(self._item(v, t) for v, t in zip(out.new_token_logprobs, ids, strict=True))
        if self.top_n > 0 and out.new_top_logprobs is not None:
            self.output_top.extend(self._top(row) for row in out.new_top_logprobs)

    def meta_info(self) -> dict[str, Any]:
        """SGLang's logprob keys of `meta_info` (tokenizer_manager.add_logprob_to_meta_info)."""
        meta: dict[str, Any] = {
            "input_token_logprobs": self.input_items,
            "output_token_logprobs": self.output_items,
            "output_token_logprobs_length": len(self.output_items),
        }
        if self.top_n > 0:
            meta["input_top_logprobs"] = self.input_top
            meta["output_top_logprobs"] = self.output_top
        return meta

    # -- OpenAI ----------------------------------------------------------------------------------------------

    def chat_content(self, start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
        """`choices[].logprobs.content` for output tokens [start, end)."""
        rows = self.output_top if self.top_n > 0 else []
        content = []
        for k, (value, token, _) in enumerate(self.output_items[start:end], start):
            text = self.token_text(token)
            tops = rows[k] if k < len(rows) else None
            content.append(
                {
                    "token": text,
                    "bytes": list(text.encode("utf-8")),
                    "logprob": value,
                    "top_logprobs": [
                        {"token": (t := self.token_text(tok)), "bytes": list(t.encode("utf-8")), "logprob": v}
                        for v, tok, _ in tops or []
                    ],
                }
            )
        return content

    def completion_logprobs(self, start: int = 0, end: int | None = None, echo: bool = False) -> dict[str, Any]:
        """OpenAI completions' `logprobs` for output tokens [start, end), the prompt's first when `echo`."""
        items = (self.input_items if echo else []) + self.output_items[start:end]
        tops: list[list[Item] | None] = []
        if self.top_n > 0:
            tops = (self.input_top if echo else []) + self.output_top[start:end]
        return {
            "text_offset": [-1] * len(items),  # SGLang: "Not supported yet"
            "token_logprobs": [v for v, _, _ in items],
            "tokens": [self.token_text(t) for _, t, _ in items],
            "top_logprobs": [None if row is None else {self.token_text(t): v for v, t, _ in row} for row in tops],
        }
