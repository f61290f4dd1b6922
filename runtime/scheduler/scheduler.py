"""The scheduler: `schedule()` decides a step's batch, `postprocess()` takes its logits (nano-vllm style, with
continuous batching); the engine runs the model in between (`EngineCore.step`: schedule → run → postprocess).

A step is a prefill step (prompt chunks of several requests in one forward, at most `chunked_prefill_size`
tokens), a decode step (one token for every running request in one forward), or, when both kinds of work exist,
a mixed step (SGLang's mixed chunk): the prompt chunks and one decode row per decoding request in ONE forward
(`BatchBuilder.mixed`), each request's KV and state advanced once. While requests decode, a step computes at
most `decoding_step_tokens` tokens, decode rows included, or with a pause target as many as keep the step
within it (`step_budget.py`), so a long prompt arriving pauses no stream for longer than one such step. A prefill
step takes further prompts only while it stays within `max_prefill_tokens` prompt tokens, so prompts that arrive
together finish one after another instead of all at the end of one long step. With `mixed_chunk` off (or
speculative decoding, whose decode steps are verify rounds) the two kinds alternate instead, under the same cap.

With the prefix cache on, the state after every multiple of `mamba_track_interval` prompt tokens (extra_buffer)
and at the branch point (where the tree's KV for the prompt ends without a state; both strategies) goes into
the cache: the model writes those states into spare slots during the prefill forward itself
(`ForwardBatch.state_checkpoints`), so prefill is never split for them; a model without that support gets
forwards that end at each checkpoint and a slot copy after it. Finished requests cache prompt + output[:-1]
with the final state, so a follow-up turn resumes after the whole previous conversation. A waiting request that
shares a long uncached prefix with a request in prefill waits until that prefix's state is cached
(`prefix_sharing.py`), so requests that arrive together compute a shared system prompt once.

Which prompt chunks a step takes is `admission.py`; sampling and emitting a step's tokens is `emit.py`; the
settings are `config.py`; admitting a request whose prompt another engine computed (PD decode) is
`transferred.py`.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Protocol

import torch

from runtime.core.batch import ForwardBatch, ScheduledBatch
from runtime.core.requests import EngineStats, GenerateRequest, RequestOutput, prompt_problem
from runtime.kvcache.cache_manager import CacheManager
from runtime.scheduler import logprobs as lp
from runtime.scheduler.admission import PrefillAdmission
from runtime.scheduler.batches import BatchBuilder, split_mixed
from runtime.scheduler.checkpoints import CheckpointPlanner
from runtime.scheduler.config import SchedulerConfig
from runtime.scheduler.emit import TokenEmitter
from runtime.scheduler.fork import ForkHolds
from runtime.scheduler.request import Req
from runtime.scheduler.sampling import select_rows
from runtime.scheduler.stats import DecodeRate, stats_snapshot
from runtime.scheduler.step_budget import PauseBudget, mean_context
from runtime.scheduler.stopping import Detokenizer, abort_reason, finish_reason_after


class SpecRounds(Protocol):
    """What the scheduler asks of a speculative decoder (runtime/speculative/worker.py SpecDecoder), which sits above
    it: spec imports the scheduler, never the reverse."""

    @property
    def extra_tokens(self) -> int:
        """Token slots a verify forward writes past a request's final length."""
        ...

    def after_prefill(self, batch: ForwardBatch) -> None: ...

    def release(self, rid: str) -> None: ...

    def plan_round(self, sched: Scheduler, reqs: list[Req]) -> ScheduledBatch[Req]:
        """The verify batch of one round for the decoding requests (their drafts, memory and scratch slots), or
        a plain decode batch when the drafter has nothing to verify."""
        ...

    def finish_round(self, sched: Scheduler, batch: ScheduledBatch[Req], logits: torch.Tensor) -> None:
        """Accept drafts against the verify logits, emit, roll each request back to what it kept."""
        ...

    def abandon_round(self, batch: ScheduledBatch[Req]) -> None:
        """The verify forward raised: drop what the round set up outside the requests' memory."""
        ...


logger = logging.getLogger("runtime.scheduler")


class Scheduler:
    def __init__(
        self,
        cache: CacheManager,
        config: SchedulerConfig,
        *,
        eos_token_ids: tuple[int, ...] = (),
        tokenizer: Detokenizer | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.cache = cache
        self.config = config
        self.checkpoints = CheckpointPlanner(cache, config)
        self.batches = BatchBuilder(cache, self.checkpoints)
        self.eos_token_ids = eos_token_ids
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.waiting: list[Req] = []
        self.running: list[Req] = []  # admitted: in prefill or decoding
        self._arrivals = itertools.count()
        self._last_was_prefill = False
        self._generator = self.new_generator(config.random_seed)
        self.counters = EngineStats()
        self.decode_rate = DecodeRate()
        self.pause_budget = PauseBudget(config.decode_pause_target_s, config.decoding_step_tokens)
        # Speculative decoding (runtime/speculative/worker.py SpecDecoder), set by the engine; None: plain decode.
        self.spec: SpecRounds | None = None
        # PD prefill (runtime/pd/prefill.py): sees a request's memory just before it goes back to the pools.
        self.on_release: Callable[[Req], None] | None = None
        self.forks = ForkHolds()  # n > 1: continuations waiting for their prompt's prefill (fork.py)
        self.admission = PrefillAdmission(self)  # which prompt chunks a step computes (admission.py)
        self.emitter = TokenEmitter(self)  # a step's new tokens: sampled, stop-checked, sent (emit.py)

    # -- requests in and out ---------------------------------------------------------------------------------

    def add_request(self, g: GenerateRequest, on_output: Callable[[RequestOutput], None]) -> None:
        """Queue a request. Whatever is wrong with it, it finishes alone (with an abort), never the engine."""
        req = Req(g.rid, [], g.sampling, on_output, g.return_logprob, next(self._arrivals))
        req.top_logprobs_num, req.logprob_start_len, req.grammar = g.top_logprobs_num, g.logprob_start_len, g.grammar
        req.cache_result = g.cache_result
        self.counters.num_requests_total += 1
        try:
            req.prompt_ids = [int(t) for t in g.input_ids]
            self._admit_to_queue(req, g)
        except Exception as exc:  # noqa: BLE001 - one request's bad values must not reach the engine loop
            logger.exception("request %s rejected", g.rid)
            if req in self.waiting:
                self.waiting.remove(req)
            self.finish(req, abort_reason(f"Request rejected: {type(exc).__name__}: {exc}", 400, "BadRequestError"))

    def _admit_to_queue(self, req: Req, g: GenerateRequest) -> None:
        # The sampling values were checked when built (SamplingParams); the prompt is checked here for a request
        # that came in-process (the server checked it with the same function).
        problem = prompt_problem(req.prompt_ids, self.config.context_len)
        if problem is None and self.spec is not None and g.sampling.has_penalties:  # verify samples without them
            problem = "penalties, min_new_tokens and logit_bias are not implemented with speculative decoding"
        if problem:
            self.finish(req, abort_reason(problem, 400, "BadRequestError"))
            return
        self.apply_sampling_limits(req, g)
        if req.max_new_tokens == 0 and lp.prompt_start(req) >= len(req.prompt_ids) - 1:
            lp.close_prompt(req)
            self.finish(req, {"type": "length", "length": 0})
            return  # (with prompt logprobs asked for, the prompt is still run: SGLang's scoring requests)
        if not self.forks.hold(req, g.fork_of if self.spec is None else None, self.waiting + self.running):
            self.waiting.append(req)

    def apply_sampling_limits(self, req: Req, g: GenerateRequest) -> None:
        """A new request's output limit (what the context leaves after its prompt) and its own generator (a seeded
        request), for a queued request and a PD-transferred one alike (transferred.py)."""
        req.max_new_tokens = min(g.sampling.max_new_tokens, self.config.context_len - len(req.prompt_ids))
        if g.sampling.seed is not None:
            req.generator = self.new_generator(g.sampling.seed)

    def abort(self, rid: str, message: str = "Aborted by the client.", status_code: int = 499) -> bool:
        """Free everything the request holds and finish it as aborted. False when the rid is unknown."""
        err_type = {499: "ClientDisconnect", 503: "ServiceUnavailable"}.get(status_code, "InternalServerError")
        held = self.forks.remove(rid)
        if held is not None:
            self.counters.num_requests_aborted += 1
            self.finish(held, abort_reason(message, status_code, err_type))
            return True
        for queue in (self.waiting, self.running):
            for req in queue:
                if req.rid == rid:
                    queue.remove(req)
                    self._release(req, cache=False)
                    self.counters.num_requests_aborted += 1
                    self.finish(req, abort_reason(message, status_code, err_type))
                    return True
        return False

    def fail(self, req: Req, stage: str, exc: BaseException, status_code: int = 500) -> None:
        """Finish one request whose `stage` raised: its memory goes back, the others run on."""
        logger.error("request %s failed in %s: %s: %s", req.rid, stage, type(exc).__name__, exc, exc_info=exc)
        for queue in (self.waiting, self.running):
            if req in queue:
                queue.remove(req)
        try:
            self._release(req, cache=False)
        except Exception:  # noqa: BLE001 - the request is finished either way; the pools' check would tell
            logger.exception("request %s: releasing its memory failed", req.rid)
        self.counters.num_requests_aborted += 1
        err_type = "BadRequestError" if status_code == 400 else "InternalServerError"
        self.finish(req, abort_reason(f"Request failed in {stage}: {type(exc).__name__}: {exc}", status_code, err_type))

    def flush_cache(self) -> bool:
        if self.waiting or self.running:
            return False
        return self.cache.flush()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- schedule ------------------------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch[Req] | None:
        """This step's batch, its memory taken: a prefill (chunks of several prompts), a decode step (one token
        for every running request; a verify round with speculative decoding), or a mixed step (both in one
        forward). None when there is nothing to do. Without mixing, prefill and decode steps alternate."""
        decode = [r for r in self.running if not r.in_prefill]
        prefill = self.admission.chunks(self.admission.budget(len(decode)))
        if prefill and decode and self.mixing:
            return self.batches.mixed(prefill, decode)
        if prefill and (not decode or not self._last_was_prefill):
            self._last_was_prefill = True
            return self.batches.prefill(prefill)
        if decode:
            self._last_was_prefill = False
            if self.spec is not None:
                return self.spec.plan_round(self, decode)
            return self.batches.decode(decode)
        return None

    @property
    def mixing(self) -> bool:
        """Whether decode rows ride in prefill steps (a verify round cannot: it is a forward of its own)."""
        return self.config.mixed_chunk and self.spec is None

    def extend_batch(self, items: list[tuple[Req, list[int]]], *, all_logits: bool = False) -> ScheduledBatch[Req]:
        """An extend batch that appends `tokens` after each request's cached ones, taking KV slots for them
        (a prefill chunk here; a verify round's last token and drafts in runtime/speculative)."""
        return self.batches.extend(items, all_logits=all_logits)

    def decode_batch(self, reqs: list[Req]) -> ScheduledBatch[Req]:
        """A plain decode step for `reqs` (a speculative round with nothing to verify)."""
        return self.batches.decode(reqs)

    # -- postprocess -----------------------------------------------------------------------------------------

    def postprocess(self, batch: ScheduledBatch[Req], logits: torch.Tensor) -> None:
        """The step's outcome: each request's KV grows by what the forward computed, checkpoints go into the
        cache, finished prompts and decoding requests get their next token (`_sample_and_emit`)."""
        if batch.drafts is None and batch.started:
            self._time_step(batch)
        if batch.drafts is not None:
            assert self.spec is not None
            self.spec.finish_round(self, batch, logits)
        elif batch.mode == "decode":
            self._finish_decode(batch.reqs, logits, batch.started)
        elif batch.decode_rows:
            prefill, prefill_logits, decode_logits = split_mixed(batch, logits)
            self._finish_decode(batch.reqs[prefill.batch_size :], decode_logits, batch.started)
            self._finish_prefill(prefill, prefill_logits)
        else:
            self._finish_prefill(batch, logits)

    def _time_step(self, batch: ScheduledBatch[Req]) -> None:
        """The step's wall time from scheduling to its logits, for the pause target's budget."""
        seconds = time.perf_counter() - batch.started
        if batch.mode == "decode":
            self.pause_budget.observe(0, batch.batch_size, seconds)
        else:
            n = batch.batch_size - batch.decode_rows
            lengths = [len(t) for t in batch.tokens[:n]]
            context = mean_context(batch.starts[:n], lengths)
            self.pause_budget.observe(sum(lengths), batch.decode_rows, seconds, context)

    def _finish_decode(self, reqs: list[Req], logits: torch.Tensor, started: float) -> None:
        """Decoding requests computed one token each: their KV grows by it, their next token is sampled."""
        for req in reqs:
            assert req.mem is not None
            req.mem.kv_len += 1
        self.emitter.sample_and_emit(reqs, logits)
        self.record_decode(time.perf_counter() - started, len(reqs))

    def abandon(self, batch: ScheduledBatch[Req]) -> None:
        """The batch's forward raised: give back what the step took beyond the requests' own memory (its
        checkpoint slots); the engine then aborts the requests, which frees the rest."""
        if batch.drafts is not None:
            assert self.spec is not None
            self.spec.abandon_round(batch)
            return
        for cps in batch.checkpoints:
            for _, slot in cps:
                self.cache.free_slot(slot)

    def _finish_prefill(self, batch: ScheduledBatch[Req], logits: torch.Tensor) -> None:
        if batch.all_logits:  # prompt logprobs asked for: every position's logits, the last of each for sampling
            ends = list(itertools.accumulate(len(t) for t in batch.tokens))
            for req, end, start, tokens in zip(batch.reqs, ends, batch.starts, batch.tokens, strict=True):
                lp.record_prompt(req, start, logits[end - len(tokens) : end])
            logits = select_rows(logits, [end - 1 for end in ends])
        if self.spec is not None:  # before any checkpoint below is cached: the drafter completes what goes with it
            assert batch.forward is not None
            self.spec.after_prefill(batch.forward)
        done: list[int] = []
        for i, (req, tokens, start) in enumerate(zip(batch.reqs, batch.tokens, batch.starts, strict=True)):
            assert req.mem is not None
            req.mem.kv_len += len(tokens)
            points = [(start + k, slot) for k, slot in batch.checkpoints[i]]
            self.counters.state_checkpoints += self.cache.commit_checkpoints(req.mem, req.prompt_ids, points)
            if req.mem.kv_len == len(req.prompt_ids):
                lp.close_prompt(req)
                done.append(i)
            elif not self.config.in_forward_checkpoints and self.checkpoints.points(req, start, req.mem.kv_len):
                if self.cache.checkpoint(req.mem, req.prompt_ids):  # the chunk ended at the checkpoint: copy it
                    self.counters.state_checkpoints += 1
        for i in [i for i in done if batch.reqs[i].max_new_tokens == 0]:  # prompt logprobs only: nothing to sample
            self.finish_running(batch.reqs[i], {"type": "length", "length": 0})
        done = [i for i in done if batch.reqs[i].max_new_tokens > 0]
        if done:
            reqs, rows = self.forks.fork(
                [batch.reqs[i] for i in done], select_rows(logits, done), self.cache,
                can_run=lambda: len(self.running) < self.config.max_running_requests,
                on_forked=self._start_fork, on_unforked=self.waiting.append,
            )  # fmt: skip
            self.emitter.sample_and_emit(reqs, rows)

    def _start_fork(self, req: Req) -> None:
        """A continuation forked off its prompt's prefill runs from now on (fork.py)."""
        self.running.append(req)
        self.counters.state_forks += 1
        self.counters.prompt_tokens_total += len(req.prompt_ids)
        self.counters.cached_tokens_total += req.cached_tokens

    # -- public hooks for spec and PD, which admit and finish requests outside `step` -------------------------

    def append_tokens(self, req: Req, tokens: list[int], logprobs: list[float] | None) -> tuple[int, dict | None]:
        """Append tokens another path chose (a verify round's accepted drafts, a transferred first token) to a
        running request's output, one by one until one finishes it: (tokens kept, finish reason or None).
        `emit` then sends them."""
        kept, reason = 0, None
        for tok in tokens:
            req.output_ids.append(tok)
            req.pending_ids.append(tok)
            if logprobs is not None:
                req.pending_logprobs.append(logprobs[kept])
            kept += 1
            reason = finish_reason_after(req, tok, self.eos_token_ids, self.tokenizer)
            if reason is not None:
                break
        self.counters.generation_tokens_total += kept
        return kept, reason

    def emit(self, req: Req, reason: dict | None) -> None:
        """Send a running request's new tokens; with a finish reason it finishes (its memory to the cache)."""
        if reason is not None:
            self.finish_running(req, reason)
        else:
            req.on_output(req.take_output())

    def next_arrival(self) -> int:
        """The arrival number of a request admitted now (orders the waiting queue)."""
        return next(self._arrivals)

    def new_generator(self, seed: int) -> torch.Generator:
        """A generator on the device the logits come from: `torch.multinomial` refuses a CPU generator for CUDA
        probabilities (every temperature > 0 request on CUDA failed its batch)."""
        return torch.Generator(device=self.device).manual_seed(seed)

    def generator_for(self, req: Req) -> torch.Generator:
        """The request's own generator (a seeded request), else the engine's shared one."""
        return req.generator or self._generator

    def finish_running(self, req: Req, reason: dict) -> None:
        """A running request stopped: take it out of the batch, cache and free its memory, send its last output."""
        self.running.remove(req)
        self._release(req, cache=req.cache_result)
        self.counters.num_requests_finished += 1
        self.finish(req, reason)

    def set_running_cap(self, cap: int) -> None:
        """At most `cap` requests run at once from the next admission on (the elastic pool's cap for its split)."""
        self.config.max_running_requests = cap

    def record_decode(self, seconds: float, tokens: int) -> None:
        """One decode step (or verify round) for the throughput gauge: the last 32 count."""
        self.decode_rate.record(seconds, tokens)

    def _release(self, req: Req, cache: bool) -> None:
        if self.spec is not None:
            self.spec.release(req.rid)
        if req.mem is not None:
            if self.on_release is not None:
                self.on_release(req)
            self.cache.release(req.mem, req.all_ids, cache)
            req.mem = None

    def finish(self, req: Req, reason: dict) -> None:
        """Send a request's last output with `reason` (what it held already given back); the continuations held for
        its prefill queue themselves."""
        self.waiting.extend(self.forks.release(req))  # it ended before its prefill did: they prefill themselves
        req.finish_reason = reason
        req.on_output(req.take_output())

    # -- observability ---------------------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        queued = len(self.waiting) + len(self.forks)
        return stats_snapshot(self.counters, self.cache, len(self.running), queued, self.decode_rate)

    def check_invariants(self) -> None:
        self.cache.check_invariants()
        assert len(self.running) <= self.config.max_running_requests
        assert all(r.mem is not None for r in self.running) and all(r.mem is None for r in self.waiting)
        assert len(self.cache.live) == len(self.running)
