"""The scheduler's settings (`SchedulerConfig`): what a step may hold and how prompts share it. The engine's
builder derives them from EngineArgs; the scheduler, its checkpoint planner and its admission read them live."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.scheduler.prefix_sharing import DEFAULT_MIN_TOKENS


@dataclass
class SchedulerConfig:
    max_running_requests: int
    chunked_prefill_size: int  # <= 0: a whole prompt per step
    context_len: int
    schedule_policy: str = "fcfs"
    checkpoint_interval: int = 0  # 0: no prefill checkpoints (cache off, or no_buffer strategy)
    # The model writes states mid-forward (ForwardBatch.state_checkpoints); else a prefill forward ends at each
    # checkpoint and the slot is copied after it.
    in_forward_checkpoints: bool = False
    random_seed: int = 0
    # A waiting request waits for a request in prefill that is about to cache at least this many more tokens of
    # its prompt than the tree has now (prefix_sharing.py). 0: never.
    in_batch_prefix_min_tokens: int = DEFAULT_MIN_TOKENS
    # Decode rows ride in the prefill steps (one forward for both); False: prefill and decode steps alternate.
    mixed_chunk: bool = True
    # While any request decodes, a step computes at most this many tokens (decode rows of a mixed step included;
    # at least one prompt token): the longest pause of a decoding stream is one such step. <= 0: no cap beyond
    # chunked_prefill_size.
    decoding_step_tokens: int = 0
    # > 0: the cap above follows this pause target from measured step times (step_budget.py PauseBudget), starting
    # at decoding_step_tokens until a prefill has been timed.
    decode_pause_target_s: float = 0.0
    # A prefill step takes another prompt chunk only while its prompt tokens stay within this (the first chunk
    # whatever its size; step_budget.fits). <= 0: no limit but the step's budget.
    max_prefill_tokens: int = 0
