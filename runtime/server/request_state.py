"""One request's progress as the server renders it: cumulative ids/text, finish reason, timings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runtime.core.requests import RequestOutput
from runtime.server.generate_request import PreparedRequest
from runtime.server.logprob_format import LogprobView
from runtime.server.sse import generate_chunk
from runtime.server.tokenizer import IncrementalDetokenizer, ServerTokenizer


@dataclass
class RequestState:
    prepared: PreparedRequest
    tokenizer: ServerTokenizer
    created: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finished_time: float | None = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    spec_verify_ct: int = 0
    spec_num_correct_drafts: int = 0
    spec_num_proposed_drafts: int = 0
    logprobs: LogprobView | None = None  # with return_logprob
    token_times: list[float] = field(default_factory=list)  # arrival time of each output chunk with tokens
    _detok: IncrementalDetokenizer | None = None
    # output_ids as JSON array items ("1,2,3"), grown per output: a streamed chunk re-sends the cumulative ids,
    # and encoding only the new ones keeps a chunk's cost flat instead of growing with the answer.
    _ids_json: str = ""

    def __post_init__(self) -> None:
        self.prompt_tokens = len(self.prepared.request.input_ids)
        self._detok = IncrementalDetokenizer(self.tokenizer, self.prepared.skip_special_tokens)
        request = self.prepared.request
        if request.return_logprob:
            self.logprobs = LogprobView(self.tokenizer, self.prepared.return_text_in_logprobs, request.top_logprobs_num)

    @property
    def rid(self) -> str:
        return self.prepared.request.rid

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def update(self, out: RequestOutput) -> None:
        now = time.perf_counter()
        if out.new_token_ids:
            if self.first_token_time is None:
                self.first_token_time = now
            self.token_times.append(now)
            self.output_ids.extend(out.new_token_ids)
            new_json = ",".join(map(str, out.new_token_ids))
            self._ids_json = f"{self._ids_json},{new_json}" if self._ids_json else new_json
        if self.logprobs is not None:
            request = self.prepared.request
            self.logprobs.update(out, request.input_ids, max(request.logprob_start_len, 0))
        self.prompt_tokens = out.prompt_tokens
        self.completion_tokens = out.completion_tokens
        self.cached_tokens = out.cached_tokens
        self.spec_verify_ct = out.spec_verify_ct
        self.spec_num_correct_drafts = out.spec_num_correct_drafts
        self.spec_num_proposed_drafts = out.spec_num_proposed_drafts
        if out.finished:
            self.finished_time = now
            self.finish_reason = out.finish_reason or {
                "type": "abort",
                "message": "finished without a reason",
            }

    def text(self) -> str:
        """Cumulative text so far; once finished, trimmed at the matched stop as SGLang's detokenizer does."""
        assert self._detok is not None
        matched = (self.finish_reason or {}).get("matched")
        ids = self.output_ids
        if self.finished and isinstance(matched, int) and not self.prepared.no_stop_trim and ids:
            ids = ids[:-1]  # the stop token itself is not part of the text
        if len(ids) < len(self._detok.ids):
            text = self.tokenizer.decode(ids, self.prepared.skip_special_tokens)
        else:
            text = self._detok.extend(ids[len(self._detok.ids) :], final=self.finished)
        if self.finished and isinstance(matched, str):
            pos = text.find(matched)
            if pos != -1:
                text = text[: pos + len(matched)] if self.prepared.no_stop_trim else text[:pos]
        return text

    def stream_text(self) -> str:
        """`text()` for a stream: until the request finishes, a tail that may still grow into a stop string is
        held back (SGLang's check_match_stop_str_prefix), so the concatenated deltas equal the final text."""
        text = self.text()
        if self.finished:
            return text
        return text[: len(text) - self.prepared.request.sampling.held_stop_prefix(text)]

    def holds_stop_prefix(self) -> bool:
        """Whether the text ends in what may still become a stop string (SGLang's check_match_stop_str_prefix):
        a stream chunk waits for the next token."""
        return not self.finished and self.prepared.request.sampling.held_stop_prefix(self.text()) > 0

    @property
    def e2e_latency(self) -> float:
        end = self.finished_time if self.finished_time is not None else time.perf_counter()
        return end - self.created

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.created

    def meta_info(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            # SGLang's OutputStreamer.get_cached_tokens_details: all of it on the device, None without a hit.
            "cached_tokens_details": {"device": self.cached_tokens, "host": 0} if self.cached_tokens > 0 else None,
        }
        if self.logprobs is not None:
            meta.update(self.logprobs.meta_info())
        if self.spec_verify_ct > 0:
            # As SGLang's _calculate_spec_decoding_metrics: rate without, length with the bonus token. NGRAM
            # rounds with nothing to verify propose no drafts, so a request may have rounds and no proposals.
            proposed = self.spec_num_proposed_drafts
            meta["spec_accept_rate"] = self.spec_num_correct_drafts / proposed if proposed else 0.0
            meta["spec_accept_length"] = self.completion_tokens / self.spec_verify_ct
            meta["spec_num_correct_drafts"] = self.spec_num_correct_drafts
            meta["spec_num_proposed_drafts"] = self.spec_num_proposed_drafts
            meta["spec_verify_ct"] = self.spec_verify_ct
        if self.finished:
            meta["e2e_latency"] = self.e2e_latency
        return meta

    def sse_chunk(self, with_index: bool) -> bytes:
        """`sse_event(self.to_dict(with_index))`, byte for byte, without re-encoding every id each time."""
        index = self.prepared.index if with_index else None
        return generate_chunk(self.text(), self._ids_json, self.meta_info(), index)

    def to_dict(self, with_index: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "text": self.text(),
            "output_ids": list(self.output_ids),
            "meta_info": self.meta_info(),
        }
        if with_index:
            out["index"] = self.prepared.index
        return out
