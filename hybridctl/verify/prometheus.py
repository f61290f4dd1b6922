"""A small parser for the Prometheus text exposition format that SGLang's `/metrics` serves.

Only what the checks need: samples by name with their labels, sums across label sets, and before/after deltas of
counters and histograms (a histogram's mean over an interval is delta(_sum) / delta(_count)).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


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
    snapshot = MetricsSnapshot()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise MetricsParseError(f"/metrics line {lineno} is not a Prometheus sample: {line[:120]!r}")
        labels = tuple((k, v) for k, v in _LABEL.findall(match.group("labels") or ""))
        try:
            value = float(match.group("value"))
        except ValueError as exc:
            raise MetricsParseError(
                f"/metrics line {lineno}: value {match.group('value')!r} is not a number"
            ) from exc
        name = match.group("name")
        snapshot.samples.setdefault(name, []).append(Sample(name=name, labels=labels, value=value))
    return snapshot


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str) -> float | None:
    """Increase of a counter between two scrapes (None if the server does not export it)."""
    end = after.total(name)
    if end is None:
        return None
    start = before.total(name) or 0.0
    return end - start


def histogram_mean_delta(
    before: MetricsSnapshot, after: MetricsSnapshot, base: str
) -> tuple[float, int] | None:
    """(mean, count) of the observations a histogram received between two scrapes, or None if it got none."""
    total = counter_delta(before, after, base + "_sum")
    count = counter_delta(before, after, base + "_count")
    if total is None or count is None or count <= 0:
        return None
    return total / count, int(round(count))
