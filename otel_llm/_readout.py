"""otel_llm's own metrics read back in process, the way a Prometheus query would see them.

`read` takes a snapshot of every histogram and gauge from an SDK ``InMemoryMetricReader`` (cumulative). The
difference of two snapshots is what happened in between (one load level); quantiles come from the bucket counts
with Prometheus's ``histogram_quantile`` interpolation, so the figures are the ones a dashboard would show.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics.export import Gauge, Histogram

from otel_llm import _semconv as sc

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

# one metric stream's attribute set, hashable
AttributeSet = frozenset[tuple[str, Any]]
Match = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class Buckets:
    """An explicit-bucket histogram: ``counts[i]`` observations in ``(bounds[i-1], bounds[i]]``, the last in
    ``(bounds[-1], +Inf)``."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float  # the sum of the observations

    @property
    def count(self) -> int:
        return sum(self.counts)

    def __add__(self, other: Buckets) -> Buckets:
        self._check(other)
        return Buckets(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)),
                       self.total + other.total)

    def __sub__(self, other: Buckets) -> Buckets:
        self._check(other)
        return Buckets(self.bounds, tuple(a - b for a, b in zip(self.counts, other.counts, strict=True)),
                       self.total - other.total)

    def _check(self, other: Buckets) -> None:
        if self.bounds != other.bounds:
            raise ValueError("histograms with different bucket bounds cannot be combined")

    def quantile(self, q: float) -> float:
        """Prometheus ``histogram_quantile(q, ...)``: find the first bucket whose cumulative count reaches rank
        ``q * count`` and interpolate linearly inside it (the first bucket starts at 0). A rank in the +Inf bucket
        gives the highest finite bound. NaN when there are no observations."""
        if not 0 < q <= 1:
            raise ValueError(f"q must be within (0, 1], got {q}")
        cumulative = list(accumulate(self.counts))
        if cumulative[-1] == 0:
            return math.nan
        rank = q * cumulative[-1]
        index = bisect_left(cumulative, rank)
        if index == len(self.bounds):
            return self.bounds[-1]
        below = cumulative[index - 1] if index else 0
        start = self.bounds[index - 1] if index else 0.0
        return start + (self.bounds[index] - start) * (rank - below) / (cumulative[index] - below)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Cumulative histogram and gauge points at one moment, by metric name and attribute set."""

    histograms: Mapping[str, Mapping[AttributeSet, Buckets]]
    gauges: Mapping[str, Mapping[AttributeSet, float]]

    def histogram(self, name: str, since: Snapshot | None = None, match: Match | None = None) -> Buckets | None:
        """The sum over the attribute sets that ``match``, minus the same sum at ``since``; None when the metric has
        no matching point."""
        merged = _merge(self.histograms.get(name, {}), match)
        if merged is None or since is None:
            return merged
        earlier = _merge(since.histograms.get(name, {}), match)
        return merged if earlier is None else merged - earlier

    def counts_by(self, name: str, key: str, since: Snapshot | None = None) -> dict[str | None, int]:
        """Observations of histogram ``name`` since ``since``, by the value of attribute ``key`` (None: absent)."""
        counts: dict[str | None, int] = {}
        earlier = since.histograms.get(name, {}) if since is not None else {}
        for attributes, buckets in self.histograms.get(name, {}).items():
            before = earlier.get(attributes)
            added = buckets.count - (before.count if before is not None else 0)
            if added:
                value = dict(attributes).get(key)
                label = None if value is None else str(value)
                counts[label] = counts.get(label, 0) + added
        return counts

    def gauge(self, name: str, match: Match | None = None) -> list[tuple[Mapping[str, Any], float]]:
        """Current values of gauge ``name`` whose attributes ``match``."""
        return [(dict(attributes), value) for attributes, value in self.gauges.get(name, {}).items()
                if match is None or match(dict(attributes))]


def read(reader: InMemoryMetricReader) -> Snapshot:
    """Collect now (observable gauges run their callbacks) and keep every histogram and gauge point."""
    histograms: dict[str, dict[AttributeSet, Buckets]] = {}
    gauges: dict[str, dict[AttributeSet, float]] = {}
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data is not None else ():
        for scope_metrics in resource_metrics.scope_metrics:
            if scope_metrics.scope.name != sc.INSTRUMENTATION_SCOPE:
                continue
            for metric in scope_metrics.metrics:
                if isinstance(metric.data, Histogram):
                    found = histograms.setdefault(metric.name, {})
                    for point in metric.data.data_points:
                        found[frozenset((point.attributes or {}).items())] = Buckets(
                            tuple(point.explicit_bounds), tuple(point.bucket_counts), point.sum)
                elif isinstance(metric.data, Gauge):
                    values = gauges.setdefault(metric.name, {})
                    for gauge_point in metric.data.data_points:
                        values[frozenset((gauge_point.attributes or {}).items())] = float(gauge_point.value)
    return Snapshot(histograms, gauges)


def _merge(points: Mapping[AttributeSet, Buckets], match: Match | None) -> Buckets | None:
    merged: Buckets | None = None
    for attributes, buckets in points.items():
        if match is None or match(dict(attributes)):
            merged = buckets if merged is None else merged + buckets
    return merged


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50/p95/p99 read from buckets with `Buckets.quantile`, and how many observations they come from; NaN when
    nothing was recorded."""

    p50: float
    p95: float
    p99: float
    count: int

    @classmethod
    def of(cls, buckets: Buckets | None) -> Percentiles:
        if buckets is None:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(buckets.quantile(0.5), buckets.quantile(0.95), buckets.quantile(0.99), buckets.count)


@dataclass(frozen=True, slots=True)
class Figures:
    """What otel_llm's metrics say about the operations between two snapshots. Latencies in seconds, from the
    operations that succeeded (no ``error.type``)."""

    operations: int
    errors: Mapping[str, int]  # error.type -> operations
    output_tokens: float | None  # None when no usage was reported
    ttft: Percentiles
    tpot: Percentiles
    duration: Percentiles

    @property
    def ok(self) -> int:
        return self.operations - sum(self.errors.values())


def figures(now: Snapshot, since: Snapshot, names: sc.MetricNames) -> Figures:
    """The figures of one level: ``now`` minus ``since``, read under the metric names in use."""

    def succeeded(attributes: Mapping[str, Any]) -> bool:
        return sc.ERROR_TYPE not in attributes

    by_error = now.counts_by(names.duration.name, sc.ERROR_TYPE, since)
    if names.token_usage is not None:
        usage = now.histogram(names.token_usage.name, since,
                              lambda a: succeeded(a) and a.get(sc.TOKEN_TYPE) == sc.TOKEN_OUTPUT)
    else:
        assert names.output_tokens is not None  # every naming scheme has one of the two
        usage = now.histogram(names.output_tokens.name, since, succeeded)
    return Figures(
        operations=sum(by_error.values()),
        errors={error: count for error, count in by_error.items() if error is not None},
        output_tokens=usage.total if usage is not None and usage.count else None,
        ttft=Percentiles.of(now.histogram(names.time_to_first_chunk.name, since, succeeded)),
        tpot=Percentiles.of(now.histogram(names.time_per_output_token.name, since, succeeded)),
        duration=Percentiles.of(now.histogram(names.duration.name, since, succeeded)),
    )


def rate_limits(snapshot: Snapshot, names: sc.MetricNames,
                match: Match | None = None) -> dict[str, tuple[float | None, float | None]]:
    """Resource (``requests``, ``tokens`` ...) -> (remaining, limit), as the rate-limit gauges last saw them."""

    def by_resource(instrument: sc.Instrument) -> dict[str, float]:
        return {str(attributes.get(sc.RATE_LIMIT_RESOURCE)): value
                for attributes, value in snapshot.gauge(instrument.name, match)}

    remaining, limit = by_resource(names.rate_limit_remaining), by_resource(names.rate_limit_limit)
    return {resource: (remaining.get(resource), limit.get(resource)) for resource in sorted(remaining | limit)}
