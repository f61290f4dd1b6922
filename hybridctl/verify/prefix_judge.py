"""The judgement of `verify prefix-cache`, from recorded numbers: thresholds, reasons, notes, statistics.

Kept apart from the measurement so it can be tested on recorded trials. Each reason says what was seen and what to
check; the no_buffer first-miss pattern is a note, not a failure, because it is how SGLang is designed to behave.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from hybridctl.verify.report import CheckResult
from hybridctl.verify.stats import Summary, bootstrap_ratio_ci, summarize
from hybridshared.units import format_percent


class OptionsError(ValueError):
    pass


@dataclass
class PrefixCacheOptions:
    doc_tokens: int = 2048
    question_tokens: int = 24
    trials: int = 5
    warmup: int = 2
    questions: int = 2  # different questions per trial; the last one is judged (the first may miss under no_buffer)
    repeats: int = 2  # identical-prompt repeats per trial; the last one is judged
    max_new_tokens: int = 4
    max_ratio: float = 0.8
    min_cached_fraction: float = 0.9
    seed: int = 0

    def validate(self) -> None:
        problems = []
        if self.doc_tokens < 16:
            problems.append(f"--doc-tokens must be >= 16 (got {self.doc_tokens})")
        if self.question_tokens < 1:
            problems.append(f"--question-tokens must be >= 1 (got {self.question_tokens})")
        if self.trials < 2:
            problems.append(f"--trials must be >= 2 for a confidence interval (got {self.trials})")
        if self.warmup < 0:
            problems.append(f"--warmup must be >= 0 (got {self.warmup})")
        if self.questions < 2:
            problems.append(
                f"--questions must be >= 2: the first may miss by design under no_buffer (got {self.questions})"
            )
        if self.repeats < 1:
            problems.append(f"--repeats must be >= 1 (got {self.repeats})")
        if self.max_new_tokens < 1:
            problems.append(f"--max-new-tokens must be >= 1 (got {self.max_new_tokens})")
        if not 0.0 < self.max_ratio <= 1.0:
            problems.append(f"--max-ratio must be within (0, 1] (got {self.max_ratio})")
        if not 0.0 < self.min_cached_fraction <= 1.0:
            problems.append(f"--min-cached-fraction must be within (0, 1] (got {self.min_cached_fraction})")
        if problems:
            raise OptionsError("; ".join(problems))


@dataclass(frozen=True)
class Request:
    ttft_s: float
    cached_tokens: int
    prompt_tokens: int


@dataclass
class Trial:
    cold: Request
    realistic: list[Request]  # same document, other questions, in order
    identical: list[Request]  # the cold prompt again, in order


_CASES = {
    "realistic": "same document, different question",
    "identical": "identical prompt (upper bound)",
}


def _ms(summary: Summary | None) -> dict[str, float] | None:
    if summary is None:
        return None
    return {k: (round(v * 1000, 3) if k != "count" else v) for k, v in summary.to_dict().items()}


def _case(trials: list[Trial], case: str, need: int, cold: list[float], seed: int) -> dict[str, Any]:
    steady = [getattr(t, case)[-1] for t in trials]
    first = [getattr(t, case)[0] for t in trials]
    warm = [r.ttft_s for r in steady]
    ratio = bootstrap_ratio_ci(warm, cold, paired=True, seed=seed)
    per_trial = [w / c for w, c in zip(warm, cold, strict=True)]
    return {
        "description": _CASES[case],
        "warm_ttft_ms": _ms(summarize(warm)),
        "ratio": ratio.to_dict(),
        "per_trial_ratio": {"min": min(per_trial), "max": max(per_trial), "values": per_trial},
        "cached_tokens": [[r.cached_tokens for r in getattr(t, case)] for t in trials],
        "judged_hits": sum(r.cached_tokens >= need for r in steady),
        "first_warm_misses": sum(r.cached_tokens < need for r in first),
        "judged": len(steady),
    }


def _no_buffer_note(case: str, info: dict[str, Any], trials: list[Trial], need: int) -> str | None:
    series = [getattr(t, case) for t in trials]
    if len(series[0]) < 2:
        return None
    pattern = sum(s[0].cached_tokens < need and all(r.cached_tokens >= need for r in s[1:]) for s in series)
    if pattern * 2 < len(series):
        return None
    return (
        f"{case}: the first warm request missed in {pattern}/{len(series)} trials and the later "
        "ones hit — SGLang's no_buffer behaviour (--mamba-radix-cache-strategy no_buffer keeps a "
        "recurrent state only "
        "at the end of each cached sequence, so that first miss checkpoints the branch point); extra_buffer "
        "checkpoints every mamba_track_interval tokens and avoids it. Judged on the last request of "
        "each trial."
    )


def _miss_hint(server_args: dict[str, Any], document_tokens: int) -> str:
    strategy = server_args.get("mamba_radix_cache_strategy")
    interval = server_args.get("mamba_track_interval")
    if strategy in ("extra_buffer", "extra_buffer_lazy") and isinstance(interval, int) and interval > 0:
        return (
            f"with {strategy} states are checkpointed every {interval} tokens, so at most "
            f"{document_tokens // interval * interval} of the {document_tokens} document tokens can match"
        )
    return "the match stopped early: check page_size (states align to pages) and mamba_radix_cache_strategy"


def judge_prefix_cache(
    trials: list[Trial],
    *,
    document_tokens: int,
    document_tokens_exact: bool,
    options: PrefixCacheOptions,
    server_args: dict[str, Any],
    metrics: dict[str, Any] | None,
    flush_refusals: list[str],
    tokenizer_note: str,
) -> CheckResult:
    if not trials:
        raise ValueError("judge_prefix_cache needs at least one trial")
    need = math.ceil(options.min_cached_fraction * document_tokens)
    cold = [t.cold.ttft_s for t in trials]
    cases = {case: _case(trials, case, need, cold, options.seed) for case in _CASES}
    notes: list[str] = [
        f"document: {document_tokens} tokens ({'exact' if document_tokens_exact else 'estimated'}; {tokenizer_note})"
    ]
    warm_all = [r for t in trials for r in (*t.realistic, *t.identical)]
    cold_hits = [t.cold.cached_tokens for t in trials if t.cold.cached_tokens >= need]
    reasons: list[str] = []
    if all(r.cached_tokens == 0 for r in warm_all):
        reasons.append(_no_hits_reason(server_args))
    elif cold_hits:
        refused = f" (/flush_cache refused: {flush_refusals[0]})" if flush_refusals else ""
        reasons.append(
            f"{len(cold_hits)} cold request(s) already hit the cache (cached_tokens "
            f"{cold_hits}){refused}: the "
            "cold numbers are not cold — other traffic is using this server; rerun when it is idle"
        )
    else:
        for case, info in cases.items():
            reason = _case_reason(case, info, need, options, server_args, document_tokens)
            if reason:
                reasons.append(reason)
            note = _no_buffer_note(case, info, trials, need)
            if note:
                notes.append(note)
    if flush_refusals and not cold_hits:
        notes.append(
            f"/flush_cache was refused {len(flush_refusals)} time(s) ({flush_refusals[0]}); every trial "
            "uses its own document, so cold requests stayed cold"
        )
    if metrics is None:
        notes.append("/metrics is not available (SGLang: --enable-metrics): no server-side cache hit rate")

    cold_ms = _ms(summarize(cold))
    measurements = {
        "document_tokens": document_tokens,
        "document_tokens_exact": document_tokens_exact,
        "required_cached_tokens": need,
        "options": asdict(options),
        "cold_ttft_ms": cold_ms,
        "cold_cached_tokens": [t.cold.cached_tokens for t in trials],
        **cases,
        "server_args": server_args,
        "metrics": metrics,
    }
    if reasons:
        return CheckResult("prefix-cache", "failed", reasons[0], reasons, notes, measurements)
    return CheckResult("prefix-cache", "passed", _summary(cases, cold_ms), reasons, notes, measurements)


def _no_hits_reason(server_args: dict[str, Any]) -> str:
    """No warm request reused anything: the cache is off, or a strategy that cannot resume mid-sequence."""
    why = (
        "cached_tokens was 0 on every warm request: the prefix cache is off or not matching — check "
        "disable_radix_cache ([runtime] in settings.json; the server's --disable-radix-cache) and "
        "enable_prefix_caching "
        "([cache] in config.toml)"
    )
    if server_args.get("disable_radix_cache") is True:
        why += "; the server reports disable_radix_cache=true"
    elif server_args.get("mamba_radix_cache_strategy") == "no_buffer":
        why += (
            "; the server runs mamba_radix_cache_strategy=no_buffer, which snapshots a recurrent "
            "state only at "
            "the end of each cached sequence, so a prompt that stops inside one finds no state to "
            "resume from "
            "— use extra_buffer (SGLang's auto picks it with page_size > 1 or the overlap schedule)"
        )
    return why


def _case_reason(
    case: str,
    info: dict[str, Any],
    need: int,
    options: PrefixCacheOptions,
    server_args: dict[str, Any],
    document_tokens: int,
) -> str | None:
    """Why one case failed: warm requests that reused too little, or hits that did not make TTFT faster."""
    if info["judged_hits"] < info["judged"]:
        judged = [row[-1] for row in info["cached_tokens"]]
        return (
            f"{case} ({info['description']}): {info['judged'] - info['judged_hits']}/"
            f"{info['judged']} warm "
            f"requests reused fewer than {need} tokens ({format_percent(options.min_cached_fraction)} of the "
            f"{document_tokens}-token document; cached_tokens {judged}): "
            f"{_miss_hint(server_args, document_tokens)}"
        )
    if info["ratio"]["ratio"] > options.max_ratio:
        r = info["ratio"]
        return (
            f"{case} ({info['description']}): warm/cold median TTFT is {r['ratio']:.2f} (95% CI "
            f"{r['ci_low']:.2f}-{r['ci_high']:.2f}) > {options.max_ratio}: the cache hits but "
            "the first token "
            f"is not faster — at {document_tokens} tokens prefill is not what dominates TTFT "
            "here (try a "
            "longer --doc-tokens) or other requests are queueing on the server"
        )
    return None


def _summary(cases: dict[str, dict[str, Any]], cold_ms: dict[str, float] | None) -> str:
    real, ident = cases["realistic"]["ratio"], cases["identical"]["ratio"]
    cold_median = f"{cold_ms['median']:.1f} ms" if cold_ms else "not measured"
    return (
        f"warm/cold TTFT {real['ratio']:.2f} (CI {real['ci_low']:.2f}-{real['ci_high']:.2f}) same document, "
        f"{ident['ratio']:.2f} identical prompt; cold median {cold_median}"
    )
