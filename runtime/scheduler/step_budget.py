"""How many prompt tokens a step may compute: while requests decode, a cap that keeps the step within a pause
target (`--decoding-step-tokens auto`), and how many prompts one prefill step takes (`--max-prefill-tokens`).

A decoding stream waits for every step, so the longest it stalls while another request's prompt is prefilled is
one step. A fixed token cap means different pauses on different models and hosts (256 tokens: ~60 ms on the 11M
demo model, ~1 s on a 0.76B one). `PauseBudget` turns a time target into tokens from the engine's own step times:
a per-token prefill cost that grows with the step's position in its prompt (each token attends over the prefix)
and a smoothed decode step (what the decode rows of a mixed step add). Until it has timed a prefill it gives the
fixed default. A slower host or a busy minute shrinks the budget within a few steps; a faster one grows it.

The per-token cost of the last few steps is carried to the next step's position by a growth with context (the
mean number of tokens a step's prompt tokens attend over), `1 + growth * context`, a property of the model fitted
over many steps (a slow least-squares line of cost on context, as a ratio). Measured on the demo model (2
threads): 139 us a token + 43 ns per prefix token, so a step 7,700 tokens into a prompt costs 3.4 times one at its
start; the flat average, a few steps behind, overshot the target late in a prompt. The budget only carries the
cost up: a step at a smaller context than the last ones (a new prompt) is priced as they were until it has been
timed, since a growth that noise has made too steep would make it look cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Steps with fewer prompt tokens than this do not update the per-token cost: their fixed part (Python, the decode
# rows, thread wake-ups) would read as a slow prefill.
MIN_TIMED_TOKENS = 32
# Weight of a new sample in the smoothed costs: a busy minute on a shared host moves the budget within a few
# steps, one outlier step by a third.
SMOOTHING = 0.3
# Weight of a new step in the fit of the cost's growth with context: about the last 20 steps (most of an
# 8,000-token prompt's), so one noisy step barely moves it.
GROWTH_SMOOTHING = 0.05
# The fit needs the steps' contexts to spread by at least this (the standard deviation, tokens) to tell growth
# from noise; until then the last growth stands (none at first: the flat average).
MIN_CONTEXT_SPREAD = 256.0
# At most: a step's per-token cost doubles every 1,024 tokens of context (the demo model's: every 3,200), so that
# a noisy fit cannot price the start of a prompt as nearly free.
MAX_GROWTH = 1.0 / 1024
# The cap stays within these bounds and is a multiple of GRANULARITY tokens (a chunk that is not pays for the
# padded scan chunk of the recurrent layers: 64 tokens for the delta rule, a Mamba2 model's chunk size). The floor
# is a step that still amortises its fixed costs: the per-token cost is measured on the steps the budget makes, so a
# small step (whose fixed part, e.g. every expert's weights read once, reads as a slow prefill) shrinks the next
# one. Without it a 0.76B Qwen3-Next fell to 32-token steps: an 8000-token prompt among decoding streams took
# 41.7 s (llama.cpp: 29.6 s), and the 4 x 4 shared-prefix workload's mean TTFT rose from 2.5 to 3.9 s. At that size
# the floor's step is the pause (~1 s); the target holds where 256 tokens take less than it (the tiny demo model).
# Measured (2 threads, a loaded host): that model's prefills cost 25 ms a token at 32 tokens, 18 at 128, 15.7 at
# 256 and 16.2 at 512, a line of 0.34 s + 15.3 ms a token, so 256 tokens is where the fixed part falls to about a
# tenth. A fitted line (fixed + per-token cost) in place of the average and the floor spiralled as well: the
# budget's own steps are all of one size, which cannot tell the two parts apart.
MIN_TOKENS = 256
# The spiral needs a fixed part as long as the target: the budget's steps then settle where fixed part + tokens
# meet it, and shrink without end where the fixed part alone passes it. Where MIN_TOKENS tokens at a prompt's start
# take at most FAST_MODEL_RATIO targets, the fixed part (8% of such a step on the 0.76B model, ~15% on the demo
# model) is well under the target, so the floor is SMALL_MIN_TOKENS: on a busy host the demo model's 256 tokens 7,000
# into a prompt take 300 ms, three targets.
FAST_MODEL_RATIO = 2.0
# "At a prompt's start": steps whose context is under this many tokens, timed as they come; until one has been,
# the last steps' cost carried down by the growth (which a first prompt's steps are still learning: its late
# steps alone would keep the demo model at the 256-token floor, 300 ms on a busy host).
START_CONTEXT = 1024
SMALL_MIN_TOKENS = 64
MAX_TOKENS = 2048
GRANULARITY = 32


def _smooth(old: float | None, sample: float) -> float:
    return sample if old is None else old + SMOOTHING * (sample - old)


@dataclass
class _GrowthFit:
    """An exponentially weighted least-squares line of per-token cost on context; growth = slope / intercept."""

    sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # weight, x, y, x*x, x*y
    growth: float = 0.0

    def add(self, context: float, token_s: float) -> None:
        sample = (1.0, context, token_s, context * context, context * token_s)
        self.sums = [s + GROWTH_SMOOTHING * (v - s) for s, v in zip(self.sums, sample, strict=True)]
        w, x, y, xx, xy = self.sums
        mx, my = x / w, y / w
        var = xx / w - mx * mx
        if var < MIN_CONTEXT_SPREAD**2:
            return
        slope = (xy / w - mx * my) / var
        intercept = my - slope * mx
        if intercept > 0:  # noise that reads as costs falling with context is no growth
            self.growth = min(max(slope, 0.0) / intercept, MAX_GROWTH)


@dataclass
class PauseBudget:
    """The prompt tokens a step may compute beside its decode rows so that it takes about `target_s`."""

    target_s: float
    initial_tokens: int  # until a prefill has been timed, the step's tokens, decode rows included
    token_s: float | None = None  # smoothed seconds per prompt token of the last steps
    context: float = 0.0  # smoothed context of those steps
    start_token_s: float | None = None  # smoothed seconds per prompt token of steps under START_CONTEXT
    decode_s: float | None = None  # smoothed seconds of a decode step
    fit: _GrowthFit = field(default_factory=_GrowthFit)

    def observe(self, prompt_tokens: int, decode_rows: int, seconds: float, context: float = 0.0) -> None:
        """One step's wall time: a decode step (no prompt tokens), a prefill, or a mixed step (both). `context`:
        the mean number of tokens its prompt tokens attend over (`mean_context`)."""
        if prompt_tokens == 0:
            if decode_rows:
                self.decode_s = _smooth(self.decode_s, seconds)
            return
        if prompt_tokens < MIN_TIMED_TOKENS:
            return
        rows_s = (self.decode_s or 0.0) if decode_rows else 0.0
        # A decode step slower than the whole step (a busy moment when it was timed) must not make the prompt's
        # tokens free: they cost at least half the step.
        per_token = max(seconds - rows_s, seconds / 2) / prompt_tokens
        self.fit.add(context, per_token)
        self.context = context if self.token_s is None else self.context + SMOOTHING * (context - self.context)
        self.token_s = _smooth(self.token_s, per_token)
        if context < START_CONTEXT:
            self.start_token_s = _smooth(self.start_token_s, per_token)

    def prompt_tokens(self, decoding: int, position: int = 0) -> int:
        """This step's prompt-token budget while `decoding` requests decode (at least one token), its chunk
        starting `position` tokens into its prompt."""
        if self.token_s is None:
            return max(self.initial_tokens - decoding, 1)
        spare = max(self.target_s - (self.decode_s or 0.0), 0.0)
        g = self.fit.growth
        base = self.token_s / (1.0 + g * self.context)  # a token's cost at no context
        tokens = spare / self.token_s
        if g > 0 and position + tokens / 2 > self.context:
            # T tokens from `position` cost T * base * (1 + g * (position + T / 2)): the T that fills `spare`.
            lead = 1.0 + g * position
            tokens = (math.sqrt(lead * lead + 2.0 * g * spare / base) - lead) / g
        start = min(base, self.start_token_s or base)
        floor = MIN_TOKENS
        if (self.decode_s or 0.0) + MIN_TOKENS * start <= FAST_MODEL_RATIO * self.target_s:
            floor = SMALL_MIN_TOKENS
        return min(max(int(tokens) // GRANULARITY * GRANULARITY, floor), MAX_TOKENS)


def mean_context(starts: list[int], lengths: list[int]) -> float:
    """The mean number of tokens a chunk's tokens attend over (its prefix, half of itself), over a step's chunks
    (`starts[i]` tokens cached before `lengths[i]` new ones)."""
    total = sum(lengths)
    return sum(n * (s + n / 2) for s, n in zip(starts, lengths, strict=True)) / total if total else 0.0


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
