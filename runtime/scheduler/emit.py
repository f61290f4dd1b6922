"""A step's new tokens: each request's next token sampled from its logits row (greedy for a plain batch; else
penalties, grammar mask and sampling parameters), appended to its output, its logprobs and grammar advanced, its
stop checks run, and its output sent or the request finished. A request whose grammar, sampling or stop check
raises fails alone; the batch goes on."""

from __future__ import annotations

from typing import Protocol

import torch

from runtime.core.requests import EngineStats
from runtime.scheduler import logprobs as lp
from runtime.scheduler.grammar import mask_isolated
from runtime.scheduler.penalties import apply_penalties
from runtime.scheduler.request import Req
from runtime.scheduler.sampling import greedy_tokens, sample_isolated
from runtime.scheduler.stopping import Detokenizer, finish_reason_after


class EmitHost(Protocol):
    """The scheduler's state and operations emitting uses (runtime/scheduler/scheduler.py Scheduler)."""

    counters: EngineStats
    eos_token_ids: tuple[int, ...]
    tokenizer: Detokenizer | None

    def fail(self, req: Req, stage: str, exc: BaseException, status_code: int = 500) -> None: ...

    def finish_running(self, req: Req, reason: dict) -> None: ...

    def generator_for(self, req: Req) -> torch.Generator: ...


class TokenEmitter:
    def __init__(self, host: EmitHost) -> None:
        self.host = host

    def sample_and_emit(self, reqs: list[Req], logits: torch.Tensor) -> None:
        tokens: list[int | None]
        if all(r.plain_greedy for r in reqs):
            # The common batch: greedy, no penalties, grammar or logprobs. One argmax, none of the per-request
            # lists and checks below (~20 us of a batch-8 step's Python).
            tokens = list(greedy_tokens(logits.float()))
        else:
            tokens = self._sample(reqs, logits)
        for i, (req, tok) in enumerate(zip(reqs, tokens, strict=True)):
            if tok is None or req.finished:
                continue  # failed alone above
            req.output_ids.append(tok)
            req.pending_ids.append(tok)
            if req.return_logprob:  # (a slice of the logits per request and token costs a few microseconds)
                lp.record_output(req, logits[i : i + 1], [tok])
            self.host.counters.generation_tokens_total += 1
            try:
                ended = req.grammar is not None and req.grammar.accept(tok)
                reason = finish_reason_after(req, tok, self.host.eos_token_ids, self.host.tokenizer)
                if reason is None and ended:  # the grammar was complete: this token (EOS) ends the request
                    reason = {"type": "stop", "matched": tok}
            except Exception as exc:  # noqa: BLE001 - e.g. a stop string the detokenizer chokes on
                self.host.fail(req, "stop check", exc)
                continue
            if reason is not None:
                self.host.finish_running(req, reason)
            else:
                req.on_output(req.take_output())

    def _sample(self, reqs: list[Req], logits: torch.Tensor) -> list[int | None]:
        """Each request's next token with its penalties, grammar and sampling parameters; a request whose
        grammar or sampling raises fails alone (None), the batch goes on."""
        logits = apply_penalties(
            logits, [r.sampling for r in reqs], [r.output_ids for r in reqs], self.host.eos_token_ids
        )
        generators = [self.host.generator_for(r) for r in reqs]
        logits, grammar_errors = mask_isolated(logits, [r.grammar for r in reqs])  # structured output
        for i, exc in grammar_errors:
            self.host.fail(reqs[i], "grammar", exc)
        tokens, errors = sample_isolated(logits, [r.sampling for r in reqs], generators)
        for i, exc in errors:
            if not reqs[i].finished:
                self.host.fail(reqs[i], "sampling", exc, status_code=400)
        return tokens
