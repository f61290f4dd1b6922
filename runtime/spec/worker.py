"""One speculative decode round for the running requests: draft → one verify forward → accept → commit.

The scheduler calls `SpecDecoder.run_round` in place of a plain decode step. Per request of kv_len L (its last
emitted token not yet run): the verify forward extends positions L..L+k with [last token, d1..dk] and returns
logits for all of them; full attention writes their K/V, linear layers write the state after each position
into the sandbox (runtime/spec/sandbox.py).
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

from runtime.core.batch import ForwardBatch
from runtime.core.spec_config import SpecConfig
from runtime.scheduler.grammar import ConstrainedRound, accept_drafts_constrained
from runtime.scheduler.logprobs import record_output
from runtime.scheduler.stopping import finish_reason_after
from runtime.spec.drafter import Drafter
from runtime.spec.sandbox import StateSandbox
from runtime.spec.verify import RoundResult, accept_drafts, release_rejected_kv

if TYPE_CHECKING:
    from runtime.scheduler.request import Req
    from runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger("runtime.spec")

RECENT_ROUNDS = 64  # the /metrics gauge averages the last rounds, as SGLang's per-interval gauge does


@dataclass
class SpecCounters:
    verify_calls: int = 0  # request-rounds (SGLang's spec_verify_ct summed over requests)
    emitted_tokens: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
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

    def run_round(self, sched: Scheduler, reqs: list[Req]) -> None:
        t0 = time.perf_counter()
        width = self.config.num_draft_tokens
        drafts = self.drafter.propose(reqs)
        cache = sched.cache
        for req, d in zip(reqs, drafts, strict=True):
            assert req.mem is not None and len(d) == width - 1
        starts = [r.mem.kv_len for r in reqs if r.mem is not None]
        items = [(req, [req.output_ids[-1], *d]) for req, d in zip(reqs, drafts, strict=True)]
        fb = sched.extend_batch(items, all_logits=True)
        slots = self.sandbox.slots_for(len(reqs))
        if self.sandbox.in_forward:
            fb.state_checkpoints = self.sandbox.checkpoints(slots)
            logits = sched.run_model(fb)
        else:
            with self.sandbox.verifying(slots):
                logits = sched.run_model(fb)
        logits = logits.view(len(reqs), width, -1)
        kept: list[int] = []
        reasons: list[dict | None] = []
        round_tokens = 0
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
            reason = None
            m = 0
            for tok in result.emitted:
                req.output_ids.append(tok)
                req.pending_ids.append(tok)
                m += 1
                reason = finish_reason_after(req, tok, sched.eos_token_ids, sched.tokenizer)
                if reason is None and constrained is not None and constrained.ended and m == len(result.emitted):
                    reason = {"type": "stop", "matched": tok}  # the grammar was complete
                if reason is not None:
                    break
            if constrained is not None and req.grammar is not None:
                constrained.rollback_to(req.grammar, m)  # the grammar follows the kept tokens only
            record_output(req, constrained.logits if constrained is not None else logits[i], result.emitted[:m])
            kept.append(m)
            reasons.append(reason)
            round_tokens += m
            req.spec_verify_ct += 1
            req.spec_correct_drafts += min(result.accepted_drafts, m)
            req.spec_proposed_drafts += width - 1
            sched.counters.generation_tokens_total += m
            self.counters.verify_calls += 1
            self.counters.emitted_tokens += m
            self.counters.correct_drafts += min(result.accepted_drafts, m)
            self.counters.proposed_drafts += width - 1
        # The request's state becomes the state after its last kept input position; its KV shrinks to match.
        self.sandbox.commit([r.mem.slot for r in reqs if r.mem is not None], kept, slots)
        for req, start, m in zip(reqs, starts, kept, strict=True):
            assert req.mem is not None
            req.mem.kv_len = start + m
            release_rejected_kv(cache, req.mem)
        for i, (req, reason) in enumerate(zip(reqs, reasons, strict=True)):
            if i in failed:
                sched.fail(req, "grammar", failed[i])
            elif reason is not None:
                sched.finish_running(req, reason)
            else:
                req.on_output(req.take_output())
        self.counters.recent.append((len(reqs), round_tokens))
        sched.record_decode(time.perf_counter() - t0, round_tokens)
