"""One speculative decode round for the running requests: draft → one verify forward → accept → commit.

The scheduler asks `SpecDecoder.plan_round` for the batch in place of a plain decode step, the engine's model
runner runs it, and the scheduler's postprocess hands the logits to `finish_round`. Per request of kv_len L (its last
emitted token not yet run): the verify forward extends positions L..L+k with [last token, d1..dk] and returns
logits for all of them; full attention writes their K/V, linear layers write the state after each position
into the sandbox (runtime/speculative/sandbox.py).
Then, per request, the accepted drafts and the bonus token are emitted one by one (stopping early at EOS, a
stop string or the length limit), the state after the last kept position is copied into the request's slot,
and the KV pages of rejected positions go back to the request's reservation.

Admission reserves k extra tokens per request, so a verify forward near max_new_tokens never runs out of KV.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from runtime.core.batch import ForwardBatch, ScheduledBatch
from runtime.core.speculative_config import SpecConfig
from runtime.scheduler.grammar import ConstrainedRound, accept_drafts_constrained
from runtime.scheduler.logprobs import record_output
from runtime.speculative.drafter import Drafter
from runtime.speculative.sandbox import StateSandbox
from runtime.speculative.verify import RoundResult, accept_drafts

if TYPE_CHECKING:
    from runtime.scheduler.request import Req
    from runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger("runtime.speculative")

RECENT_ROUNDS = 64  # the /metrics gauge averages the last rounds, as SGLang's per-interval gauge does


@dataclass
class SpecCounters:
    verify_calls: int = 0  # request-rounds (SGLang's spec_verify_ct summed over requests)
    emitted_tokens: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    plain_rounds: int = 0  # rounds the drafter had nothing for, run as plain decode steps
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=RECENT_ROUNDS))

    @property
    def avg_accept_length(self) -> float:
        return self.emitted_tokens / self.verify_calls if self.verify_calls else 0.0

    @property
    def accept_rate(self) -> float:
        return self.correct_drafts / self.proposed_drafts if self.proposed_drafts else 0.0

    @property
    def recent_accept_length(self) -> float:
        calls = sum(c for c, _ in self.recent)
        return sum(t for _, t in self.recent) / calls if calls else 0.0


class SpecDecoder:
    def __init__(self, config: SpecConfig, drafter: Drafter, sandbox: StateSandbox) -> None:
        self.config = config
        self.drafter = drafter
        self.sandbox = sandbox
        self.counters = SpecCounters()

    @property
    def extra_tokens(self) -> int:
        """KV tokens a request may hold beyond its own length during a verify forward."""
        return self.config.num_drafts

    def after_prefill(self, batch: ForwardBatch) -> None:
        self.drafter.after_prefill(batch)

    def release(self, rid: str) -> None:
        self.drafter.release(rid)

    def plan_round(self, sched: Scheduler, reqs: list[Req]) -> ScheduledBatch[Req]:
        """The verify batch: per request [last token, d1..dk] after its KV, every logit row asked for, and the
        states after each position bound for its group of sandbox slots (in-forward checkpoints, or the
        sandboxed mixers stepping position by position until `finish_round`)."""
        started = time.perf_counter()
        width = self.config.num_draft_tokens
        drafts = self.drafter.propose(reqs)
        if drafts is None:  # nothing to verify: the scheduler's own decode step (and its postprocess)
            self._count_plain_round(reqs)
            return sched.decode_batch(reqs)
        for req, d in zip(reqs, drafts, strict=True):
            assert req.mem is not None and len(d) == width - 1
        items = [(req, [req.output_ids[-1], *d]) for req, d in zip(reqs, drafts, strict=True)]
        batch = sched.extend_batch(items, all_logits=True)
        slots = self.sandbox.slots_for(len(reqs))
        if self.sandbox.in_forward:
            batch.checkpoints = self.sandbox.checkpoints(slots)
        else:
            self.sandbox.activate(slots)
        batch.drafts, batch.scratch_slots, batch.started = drafts, slots, started
        return batch

    def _count_plain_round(self, reqs: list[Req]) -> None:
        """A round without drafts still counts as a round of one token per request, so accept length stays
        tokens per target forward (SGLang's completion_tokens / spec_verify_ct) and proposed drafts stay honest."""
        self.counters.plain_rounds += 1
        self.counters.verify_calls += len(reqs)
        self.counters.emitted_tokens += len(reqs)
        self.counters.recent.append((len(reqs), len(reqs)))
        for req in reqs:
            req.spec_verify_ct += 1

    def abandon_round(self, batch: ScheduledBatch[Req]) -> None:
        self.sandbox.deactivate()

    def finish_round(self, sched: Scheduler, batch: ScheduledBatch[Req], logits: torch.Tensor) -> None:
        """Accept each request's drafts, emit what it kept, and roll its state and KV back to the last kept
        position."""
        self.sandbox.deactivate()
        reqs, drafts, slots = batch.reqs, batch.drafts, batch.scratch_slots
        assert drafts is not None and slots is not None
        width = self.config.num_draft_tokens
        logits = logits.view(len(reqs), width, -1)
        kept: list[int] = []
        reasons: list[dict | None] = []
        failed: dict[int, Exception] = {}
        for i, (req, d) in enumerate(zip(reqs, drafts, strict=True)):
            # Structured output: drafts are checked against the grammar's mask row by row (grammar.py).
            constrained: ConstrainedRound | None = None
            if req.grammar is not None:
                try:
                    constrained = accept_drafts_constrained(
                        d, logits[i], req.sampling, sched.generator_for(req), req.grammar
                    )
                except Exception as exc:  # noqa: BLE001 - this request fails after the round; the others go on
                    failed[i] = exc
            if constrained is not None:
                result = RoundResult(constrained.emitted, constrained.accepted_drafts, None)
            else:
                result = accept_drafts(d, logits[i], req.sampling, sched.generator_for(req))
            m, reason = sched.append_tokens(req, result.emitted, None)  # logprobs: record_output below
            if reason is None and constrained is not None and constrained.ended and m == len(result.emitted):
                reason = {"type": "stop", "matched": result.emitted[-1]}  # the grammar was complete
            if constrained is not None and req.grammar is not None:
                constrained.rollback_to(req.grammar, m)  # the grammar follows the kept tokens only
            record_output(req, constrained.logits if constrained is not None else logits[i], result.emitted[:m])
            kept.append(m)
            reasons.append(reason)
            correct = min(result.accepted_drafts, m)
            req.spec_verify_ct += 1
            req.spec_correct_drafts += correct
            req.spec_proposed_drafts += width - 1
            self.counters.verify_calls += 1
            self.counters.emitted_tokens += m
            self.counters.correct_drafts += correct
            self.counters.proposed_drafts += width - 1
        # The request's state becomes the state after its last kept input position; its KV shrinks to match.
        self.sandbox.commit(batch.state_slots, kept, slots)
        for req, start, m in zip(reqs, batch.starts, kept, strict=True):
            assert req.mem is not None
            sched.cache.truncate(req.mem, start + m)
        for i, (req, reason) in enumerate(zip(reqs, reasons, strict=True)):
            if i in failed:
                sched.fail(req, "grammar", failed[i])
            else:
                sched.emit(req, reason)
        round_tokens = sum(kept)
        self.counters.recent.append((len(reqs), round_tokens))
        sched.record_decode(time.perf_counter() - batch.started, round_tokens)
