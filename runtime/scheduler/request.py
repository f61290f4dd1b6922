"""A request inside the scheduler: its tokens, sampling state and what it holds in the pools."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.core.requests import RequestOutput, SamplingParams
from runtime.kvcache.cache_manager import ReqMemory
from runtime.scheduler.grammar import RequestGrammar
from runtime.scheduler.sampling import is_greedy


@dataclass
class Req:
    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    on_output: Callable[[RequestOutput], None]
    return_logprob: bool = False
    arrival: int = 0  # admission order, for fcfs
    max_new_tokens: int = 0  # sampling.max_new_tokens clipped to the context length
    output_ids: list[int] = field(default_factory=list)
    mem: ReqMemory | None = None  # None while waiting
    cached_tokens: int = 0
    generator: torch.Generator | None = None
    finish_reason: dict[str, Any] | None = None
    # Outputs produced since the last RequestOutput (sent once per step).
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[float | None] = field(default_factory=list)
    prefix_hint: int = 0  # lpm: cached-prefix length seen at the last queue ordering
    # Prompt positions a waiting request sharing this prefix asked to be checkpointed (prefix_sharing.py).
    share_points: set[int] = field(default_factory=set)
    # Logprobs (runtime/scheduler/logprobs.py) and structured output (runtime/scheduler/grammar.py).
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    pending_top_logprobs: list[list[tuple[float | None, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None  # sent once, with the first output after prefill
    input_top_logprobs: list[list[tuple[float | None, int]] | None] | None = None
    input_logprobs_sent: bool = False
    grammar: RequestGrammar | None = None
    cache_result: bool = True  # GenerateRequest.cache_result: the finished sequence goes into the prefix cache
    spec_verify_ct: int = 0  # speculative verify rounds this request took part in
    spec_correct_drafts: int = 0
    spec_proposed_drafts: int = 0
    _plain_greedy: bool | None = field(default=None, repr=False, compare=False)

    @property
    def plain_greedy(self) -> bool:
        """Greedy, without penalties, grammar or logprobs: its token is the row's argmax, nothing else. Fixed once
        the request is set up (sampling, grammar and logprob options never change after), so kept after the
        first ask."""
        plain = self._plain_greedy
        if plain is None:
            p = self.sampling
            plain = is_greedy(p) and not p.has_penalties and self.grammar is None and not self.return_logprob
            self._plain_greedy = plain
        return plain

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def in_prefill(self) -> bool:
        return self.mem is not None and self.mem.kv_len < len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def take_output(self) -> RequestOutput:
        out = RequestOutput(
            rid=self.rid,
            new_token_ids=self.pending_ids,
            finished=self.finished,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.output_ids),
            cached_tokens=self.cached_tokens,
            new_token_logprobs=self.pending_logprobs if self.return_logprob else None,
            new_top_logprobs=self.pending_top_logprobs if self.top_logprobs_num > 0 else None,
            spec_verify_ct=self.spec_verify_ct,
            spec_num_correct_drafts=self.spec_correct_drafts,
            spec_num_proposed_drafts=self.spec_proposed_drafts,
        )
        if self.input_logprobs is not None and not self.input_logprobs_sent:
            out.input_token_logprobs, out.input_top_logprobs = self.input_logprobs, self.input_top_logprobs
            self.input_logprobs_sent = True
        self.pending_ids, self.pending_logprobs, self.pending_top_logprobs = [], [], []
        return out
