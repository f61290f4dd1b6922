"""Samples of the Prometheus text that SGLang's `/metrics` serves, read with prometheus_client's parser.

What the checks need on top of it: samples by name with their labels, sums across label sets, and before/after
deltas of counters and histograms (a histogram's mean over an interval is delta(_sum) / delta(_count)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


class MetricsParseError(ValueError):
    pass


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass
class MetricsSnapshot:
    """All samples of one scrape, grouped by sample name."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.samples

    def total(self, name: str, **match: str) -> float | None:
        """Sum of a sample over all label sets (optionally only those whose labels include `match`)."""
        found = self.samples.get(name)
        if not found:
            return None
        values = [s.value for s in found if all(dict(s.labels).get(k) == v for k, v in match.items())]
        if not values:
            return None
        return math.fsum(values)


def parse_metrics(text: str) -> MetricsSnapshot:
    """Every sample of a scrape; label values unescaped, timestamps dropped."""
    snapshot = MetricsSnapshot()
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                sample = Sample(name=s.name, labels=tuple(s.labels.items()), value=float(s.value))
                snapshot.samples.setdefault(s.name, []).append(sample)
    except ValueError as exc:
        raise _located(text, exc) from exc
    return snapshot


def _located(text: str, exc: ValueError) -> MetricsParseError:
    """The error naming the first line that does not parse on its own (the library's message has no line)."""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        try:
            list(text_string_to_metric_families(raw + "\n"))
        except ValueError as line_exc:
            return MetricsParseError(
                f"/metrics line {lineno} is not a Prometheus sample (name, labels, value) or its value is not a number:"
                f" {raw.strip()[:120]!r} ({line_exc})"
            )
    return MetricsParseError(f"/metrics is not Prometheus text: {exc}")


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str) -> float | None:
    """Increase of a counter between two scrapes (None if the server does not export it)."""
    end = after.total(name)
    if end is None:
        return None
    start = before.total(name) or 0.0
    return end - start


def histogram_mean_delta(before: MetricsSnapshot, after: MetricsSnapshot, base: str) -> tuple[float, int] | None:
    """(mean, count) of the observations a histogram received between two scrapes, or None if it got none."""
    total = counter_delta(before, after, base + "_sum")
    count = counter_delta(before, after, base + "_count")
    if total is None or count is None or count <= 0:
        return None
    return total / count, int(round(count))
