"""How many prompt tokens a step may compute: while requests decode, a cap that keeps the step within a pause
target (`--decoding-step-tokens auto`), and how many prompts one prefill step takes (`--max-prefill-tokens`).

A decoding stream waits for every step, so the longest it stalls while another request's prompt is prefilled is
one step. A fixed token cap means different pauses on different models and hosts (256 tokens: ~60 ms on the 11M
demo model, ~1 s on a 0.76B one). `PauseBudget` turns a time target into tokens from the engine's own step times:
a line, step seconds = fixed + per-token x tokens, fitted to the recent prefill and mixed steps (`StepFit`). Until
it has timed a prefill it gives the fixed default. A slower host or a busy minute moves the line within a few
steps.

Why a line and not a per-token average: a step's fixed part (Python, thread wake-ups, every weight read once)
divided among few tokens reads as slow tokens, so an average shrinks the next step, which reads slower still. A
0.76B Qwen3-Next fell that way to 32-token steps: an 8000-token prompt among decoding streams took 41.7 s
(llama.cpp: 29.6 s), and the 4 x 4 shared-prefix workload's mean TTFT rose from 2.5 to 3.9 s.
"""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest step in the line's level (how fast steps are now): a busy minute on a shared host moves it
# within a few steps, one outlier step by about a third.
SMOOTHING = 0.3
# The same for its shape (how much of a step is fixed cost), which the host's speed does not change: slow, so that
# the noise of a shared host's steps averages out over ~20 of them.
SHAPE_SMOOTHING = 0.05
# The shape is a per-token average (no fixed cost) until this many steps' worth: two or three steps, one of them
# slowed by the host, can make a line of any shape.
MIN_SHAPE_STEPS = 8.0
# Steps of about one size (every chunk at the cap) say nothing about how a step's time splits into fixed and
# per-token parts: while the sizes' weighted spread (standard deviation over mean) is under this, the fit keeps its
# last fixed cost and moves only the per-token cost (a slower host shows as slower tokens).
MIN_SPREAD = 0.3
# In the shape's fit a step counts as at most this many times what the line says: a step slowed by a busy moment of
# the shared host (or a page-in) would otherwise read as a large fixed cost. The level takes it as it is, so a
# lasting slowdown still shows within a few steps.
MAX_SURPRISE = 1.5
# The cap at most doubles from one step to the next: a line that a few odd steps bent does not turn into one
# step of thousands of tokens; the larger step's own time then corrects it.
MAX_GROWTH = 2
# A step is never so small that its fixed cost is more than this share of it: where the target cannot be met
# otherwise, the pause is what prefilling at 90% of full speed takes, not a spiral of ever smaller, ever less
# efficient steps. Measured prefills (16 to 512 tokens, 2 threads, a loaded host) fit 0.34 s + 15.3 ms a token on
# the 0.76B Qwen3-Next (so ~200 tokens: what the former 256-token floor gave) and 7.4 ms + 0.30 ms a token on the
# 11M demo model (~220 tokens, under what its 100 ms target allows, ~290).
MAX_FIXED_SHARE = 0.1
# The cap is a multiple of GRANULARITY tokens (a chunk that is not pays for the padded scan chunk of the recurrent
# layers: 64 tokens for the delta rule, a Mamba2 model's chunk size) and at most MAX_TOKENS.
GRANULARITY = 32
MAX_TOKENS = 2048


@dataclass
class StepFit:
    """Step seconds against the tokens a forward computes (prompt tokens plus decode rows), as a line
    seconds = token_s * (fixed_tokens + tokens): its shape, the fixed cost in tokens' worth, from a slow exponentially
    weighted least-squares fit (a slower host scales both parts alike, so the shape holds), its level from a fast
    average (SMOOTHING) of the recent steps."""

    weight: float = 0.0  # the slow fit's sums of the samples' weights, of w*x, w*x^2, w*y and w*x*y
    x: float = 0.0
    xx: float = 0.0
    y: float = 0.0
    xy: float = 0.0
    recent_tokens: float = 0.0  # the fast averages
    recent_s: float = 0.0
    fixed_tokens: float = 0.0
    token_s: float = 0.0

    @property
    def fixed_s(self) -> float:
        return self.fixed_tokens * self.token_s

    def add(self, tokens: int, seconds: float) -> None:
        if self.weight:
            self.recent_tokens += SMOOTHING * (tokens - self.recent_tokens)
            self.recent_s += SMOOTHING * (seconds - self.recent_s)
            seconds = min(seconds, MAX_SURPRISE * self.token_s * (self.fixed_tokens + tokens))
        else:
            self.recent_tokens, self.recent_s = tokens, seconds
        keep = 1.0 - SHAPE_SMOOTHING
        self.weight = keep * self.weight + 1.0
        self.x = keep * self.x + tokens
        self.xx = keep * self.xx + tokens * tokens
        self.y = keep * self.y + seconds
        self.xy = keep * self.xy + tokens * seconds
        mean_x, mean_s = self.x / self.weight, self.y / self.weight
        variance = self.xx / self.weight - mean_x * mean_x
        if self.weight >= MIN_SHAPE_STEPS and variance > (MIN_SPREAD * mean_x) ** 2:
            slope = (self.xy / self.weight - mean_x * mean_s) / variance
            if slope > 0:
                # Noise can put the line's foot below zero: no fixed cost then.
                self.fixed_tokens = max(mean_s / slope - mean_x, 0.0)
        self.token_s = self.recent_s / (self.fixed_tokens + self.recent_tokens)

    def tokens_within(self, seconds: float) -> float:
        """The tokens a forward computes in `seconds`, by the line (negative where its fixed cost alone exceeds)."""
        return seconds / self.token_s - self.fixed_tokens

    def amortising_tokens(self) -> float:
        """The tokens a forward needs for its fixed cost to be MAX_FIXED_SHARE of it."""
        return self.fixed_tokens * (1.0 - MAX_FIXED_SHARE) / MAX_FIXED_SHARE


@dataclass
class PauseBudget:
    """The prompt tokens a step may compute beside its decode rows so that it takes about `target_s`."""

    target_s: float
    initial_tokens: int  # until a prefill has been timed, the step's tokens, decode rows included
    fit: StepFit | None = None
    last_tokens: int = 0  # the budget last given (0: none yet)

    def observe(self, prompt_tokens: int, decode_rows: int, seconds: float) -> None:
        """One step's wall time: a decode step (no prompt tokens), a prefill, or a mixed step (both). The decode
        rows of a mixed step are rows of the same forward, so they count as its tokens; a decode-only step runs
        another path (the native decode) whose time says little about a forward's, and is left out."""
        if prompt_tokens == 0:
            return
        if self.fit is None:
            self.fit = StepFit()
        self.fit.add(prompt_tokens + decode_rows, seconds)

    def prompt_tokens(self, decoding: int) -> int:
        """This step's prompt-token budget while `decoding` requests decode (at least one token)."""
        if self.fit is None:
            return max(self.initial_tokens - decoding, 1)
        if self.fit.fixed_s <= self.target_s / 2:  # the target leaves the tokens at least the fixed cost's time
            tokens = int(max(self.fit.tokens_within(self.target_s) - decoding, 0.0)) // GRANULARITY
        else:
            tokens = -int(-max(self.fit.amortising_tokens() - decoding, 0.0) // GRANULARITY)  # rounded up
        tokens = min(max(tokens, 1) * GRANULARITY, MAX_TOKENS)
        if self.last_tokens:
            tokens = min(tokens, MAX_GROWTH * self.last_tokens)
        self.last_tokens = tokens
        return tokens


def fits(step_tokens: int, chunk: int, limit: int) -> bool:
    """Whether another prompt chunk of `chunk` tokens joins a prefill step already holding `step_tokens` prompt
    tokens (SGLang's PrefillAdder with --max-prefill-tokens): the first always does; the others while the step
    stays within `limit` (<= 0: no limit)."""
    return step_tokens == 0 or limit <= 0 or step_tokens + chunk <= limit


def describe_step_cap(decoding_step_tokens: int, decode_pause_target_s: float) -> str:
    """The cap as the start-up log and /server_info give it: "auto (100 ms)", a token count, or "0" (none)."""
    if decode_pause_target_s > 0:
        return f"auto ({decode_pause_target_s * 1000:g} ms)"
    return str(decoding_step_tokens)
