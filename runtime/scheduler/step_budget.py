"""How many prompt tokens a step may compute: while requests decode, a cap that keeps the step within a pause
target (`--decoding-step-tokens auto`), and how many prompts one prefill step takes (`--max-prefill-tokens`).

A decoding stream waits for every step, so the longest it stalls while another request's prompt is prefilled is
one step. A fixed token cap means different pauses on different models and hosts (256 tokens: ~60 ms on the 11M
demo model, ~1 s on a 0.76B one). `PauseBudget` turns a time target into tokens from the engine's own step times:
a smoothed per-token prefill cost (extend steps with enough prompt tokens that their fixed cost is small beside
them) and a smoothed decode step (what the decode rows of a mixed step add). Until it has timed a prefill it gives
the fixed default. A slower host or a busy minute shrinks the budget within a few steps; a faster one grows it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Steps with fewer prompt tokens than this do not update the per-token cost: their fixed part (Python, the decode
# rows, thread wake-ups) would read as a slow prefill.
MIN_TIMED_TOKENS = 32
# Weight of a new sample in the smoothed costs: a busy minute on a shared host moves the budget within a few
# steps, one outlier step by a third.
SMOOTHING = 0.3
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
# budget's own steps are all of one size, which cannot tell the two parts apart, and a step's cost also grows with
# its position in the prompt (attention over the prefix), which a line in the step's tokens reads as no fixed cost.
MIN_TOKENS = 256
MAX_TOKENS = 2048
GRANULARITY = 32


def _smooth(old: float | None, sample: float) -> float:
    return sample if old is None else old + SMOOTHING * (sample - old)


@dataclass
class PauseBudget:
    """The prompt tokens a step may compute beside its decode rows so that it takes about `target_s`."""

    target_s: float
    initial_tokens: int  # until a prefill has been timed, the step's tokens, decode rows included
    token_s: float | None = None  # smoothed seconds per prompt token
    decode_s: float | None = None  # smoothed seconds of a decode step

    def observe(self, prompt_tokens: int, decode_rows: int, seconds: float) -> None:
        """One step's wall time: a decode step (no prompt tokens), a prefill, or a mixed step (both)."""
        if prompt_tokens == 0:
            if decode_rows:
                self.decode_s = _smooth(self.decode_s, seconds)
            return
        if prompt_tokens < MIN_TIMED_TOKENS:
            return
        rows_s = (self.decode_s or 0.0) if decode_rows else 0.0
        # A decode step slower than the whole step (a busy moment when it was timed) must not make the prompt's
        # tokens free: they cost at least half the step.
        self.token_s = _smooth(self.token_s, max(seconds - rows_s, seconds / 2) / prompt_tokens)

    def prompt_tokens(self, decoding: int) -> int:
        """This step's prompt-token budget while `decoding` requests decode (at least one token)."""
        if self.token_s is None:
            return max(self.initial_tokens - decoding, 1)
        spare = self.target_s - (self.decode_s or 0.0)
        tokens = int(max(spare, 0.0) / self.token_s) // GRANULARITY * GRANULARITY
        return min(max(tokens, MIN_TOKENS), MAX_TOKENS)


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
