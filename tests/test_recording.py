"""Direct histogram records give exactly the points the public API gives, and fall back to it where they must."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import (
    AlignedHistogramBucketExemplarReservoir,
    AlwaysOnExemplarFilter,
    ExemplarFilter,
    MeterProvider,
)
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.trace import TracerProvider

from otel_llm import _semconv as sc
from otel_llm._recording import _NO_EXEMPLAR, Histogram

ATTRIBUTES = [{sc.REQUEST_MODEL: model, sc.SERVER_PORT: 443} for model in ("a", "b")]
TIME = 1_700_000_000_000_000_000


def span_context() -> Any:
    return trace.set_span_in_context(TracerProvider().get_tracer("t").start_span("s"))


def points(reader: InMemoryMetricReader) -> list[tuple[Any, ...]]:
    data = reader.get_metrics_data()
    assert data is not None
    (metric,) = data.resource_metrics[0].scope_metrics[0].metrics
    return sorted((
        (dict(p.attributes), p.count, p.sum, p.min, p.max, list(getattr(p, "bucket_counts", [])),
         sorted((e.value, e.span_id, e.filtered_attributes) for e in p.exemplars))
        for p in metric.data.data_points
    ), key=lambda point: str(point[0]))


def sdk_histogram(reader: InMemoryMetricReader, **provider: Any) -> Any:
    meter = MeterProvider(metric_readers=[reader], **provider).get_meter("t")
    return meter.create_histogram("h", unit="s", explicit_bucket_boundaries_advisory=list(sc.CHUNK_BUCKETS))


def record_public(histogram: Any, values: list[tuple[float, int]], context: Any) -> None:
    for value, series in values:
        histogram.record(value, ATTRIBUTES[series], context=context)


def record_direct(histogram: Histogram, values: list[tuple[float, int]], context: Any) -> list[Any]:
    series = [histogram.series(attributes) for attributes in ATTRIBUTES]
    for value, index in values:
        series[index].record(value, TIME, context)
    return series


class _EveryOtherValue(ExemplarFilter):
    """A filter that looks at the value, not only the context."""

    def should_sample(self, value: float, time_unix_nano: int, attributes: Any, context: Any) -> bool:
        return int(value * 1e6) % 2 == 0


FILTERS = pytest.mark.parametrize("exemplar_filter", [None, AlwaysOnExemplarFilter(), _EveryOtherValue()],
                                  ids=["trace-based", "always-on", "value-based"])


@FILTERS
def test_direct_records_match_the_public_api(exemplar_filter: ExemplarFilter | None) -> None:
    rng = random.Random(5)
    values = [(rng.lognormvariate(-4, 1), rng.randrange(2)) for _ in range(500)]
    context = span_context()
    provider = {"exemplar_filter": exemplar_filter} if exemplar_filter else {}
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public, **provider)
    record_public(public_histogram, values, context)
    histogram = Histogram(sdk_histogram(direct, **provider))
    series = record_direct(histogram, values, context)
    assert all(s._aggregations and s._reservoirs for s in series)  # the direct path was taken, exemplars too
    assert points(direct) == points(public)
    # and again after a collection, recorded without a span: cumulative series keep counting into the same
    # aggregations, and such values become exemplars only under a filter that samples without a span
    record_public(public_histogram, values[:50], _NO_EXEMPLAR)
    for value, index in values[:50]:
        series[index].record(value, TIME)
    assert points(direct) == points(public)
    counts = [sum(1 for _, index in values + values[:50] if index == i) for i in (0, 1)]
    assert [point[1] for point in points(direct)] == counts


@FILTERS
def test_a_batch_of_gaps_matches_one_public_record_each(exemplar_filter: ExemplarFilter | None) -> None:
    rng = random.Random(7)
    gaps_ns = [int(rng.lognormvariate(16, 1)) for _ in range(300)]
    longest = max(gaps_ns)
    gaps_ns[100] = longest  # the longest twice: only the first carries the trace
    context = span_context()
    provider = {"exemplar_filter": exemplar_filter} if exemplar_filter else {}
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public, **provider)
    exemplar = longest
    for gap in gaps_ns:
        public_histogram.record(gap / 1e9, ATTRIBUTES[0], context=context if gap == exemplar else _NO_EXEMPLAR)
        if gap == exemplar:
            exemplar = -1
    series = Histogram(sdk_histogram(direct, **provider)).series(ATTRIBUTES[0])
    series.record_ns(gaps_ns[:1], TIME, _NO_EXEMPLAR, -1)  # the first value creates the series, publicly
    series.record_ns(gaps_ns[1:], TIME, context, longest)
    assert series._aggregations
    assert points(direct) == points(public)


def test_gaps_other_than_the_longest_never_link_to_the_callers_span() -> None:
    reader = InMemoryMetricReader()
    series = Histogram(sdk_histogram(reader)).series(ATTRIBUTES[0])
    ours = span_context()
    with trace.use_span(TracerProvider().get_tracer("t").start_span("caller")):  # a sampled span of the caller
        series.record_ns([1_000_000, 5_000_000], TIME, ours, 5_000_000)  # public API: creates the series
        series.record_ns([2_000_000, 3_000_000, 4_000_000], TIME, ours, 4_000_000)  # direct
    ((*_, exemplars),) = points(reader)
    our_span = trace.get_current_span(ours).get_span_context().span_id
    assert exemplars == [(0.004, our_span, {}), (0.005, our_span, {})]


@pytest.mark.parametrize("provider", [
    {"views": [View(instrument_name="h", attribute_keys={sc.REQUEST_MODEL})]},
    {"views": [View(instrument_name="h", aggregation=ExponentialBucketHistogramAggregation())]},
], ids=["attribute-filtering view", "exponential histogram view"])
def test_views_take_the_public_api(provider: dict[str, Any]) -> None:
    values = [(0.001 * i, i % 2) for i in range(1, 40)]
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    record_public(sdk_histogram(public, **provider), values, span_context())
    series = record_direct(Histogram(sdk_histogram(direct, **provider)), values, span_context())
    assert not any(s._aggregations for s in series)
    assert [point[:6] for point in points(direct)] == [point[:6] for point in points(public)]


def test_delta_readers_take_the_public_api() -> None:
    delta = {SdkHistogram: AggregationTemporality.DELTA}
    values = [(0.001 * i, i % 2) for i in range(1, 40)]
    public = InMemoryMetricReader(preferred_temporality=delta)
    direct = InMemoryMetricReader(preferred_temporality=delta)
    record_public(sdk_histogram(public), values, _NO_EXEMPLAR)
    series = record_direct(Histogram(sdk_histogram(direct)), values, _NO_EXEMPLAR)
    assert not any(s._aggregations for s in series)
    assert points(direct) == points(public)
    for value, index in values[:5]:  # after a delta collection, still every value
        series[index].record(value, TIME, _NO_EXEMPLAR)
    assert sum(p[1] for p in points(direct)) == 5


def test_a_reader_added_later_sees_every_value_after_it() -> None:
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[first])
    series = Histogram(provider.get_meter("t").create_histogram(
        "h", explicit_bucket_boundaries_advisory=list(sc.CHUNK_BUCKETS))).series(ATTRIBUTES[0])
    for _ in range(3):
        series.record(0.01, TIME, _NO_EXEMPLAR)
    provider.add_metric_reader(second)
    series.record_ns([20_000_000, 20_000_000], TIME, _NO_EXEMPLAR, -1)
    assert points(first)[0][1] == 5
    assert points(second)[0][1] == 2


def test_values_the_sdk_refuses_are_refused_the_same_way() -> None:
    reader = InMemoryMetricReader()
    series = Histogram(sdk_histogram(reader)).series(ATTRIBUTES[0])
    for value in (0.5, 0.25, -1.0, float("nan"), float("inf"), 0.75):
        series.record(value, TIME, _NO_EXEMPLAR)
    series.record_ns([], TIME, _NO_EXEMPLAR, -1)  # a stream without gaps: nothing
    ((*_, count, total, low, high, _, _),) = points(reader)
    assert (count, total, low, high) == (3, 1.5, 0.25, 0.75)


def test_internals_that_are_not_as_expected_fall_back() -> None:
    reader = InMemoryMetricReader()
    histogram = Histogram(sdk_histogram(reader))
    series = histogram.series(ATTRIBUTES[0])
    series.record(0.01, TIME, _NO_EXEMPLAR)
    assert series._aggregations
    series._aggregations = (object(),)  # an aggregation without the SDK's insides
    series.record(0.02, TIME, _NO_EXEMPLAR)
    series.record_ns([30_000_000], TIME, _NO_EXEMPLAR, -1)
    assert histogram._consumer is None  # off for good, and nothing was lost
    assert points(reader)[0][1] == 3


class _FailingReservoir(AlignedHistogramBucketExemplarReservoir):
    """An exemplar reservoir (a user's own, say) that fails on large values."""

    def offer(self, value: float, *args: Any) -> None:
        if value > 1.0:
            raise RuntimeError("reservoir failure")
        super().offer(value, *args)


def test_a_failure_after_the_value_is_in_never_counts_it_twice() -> None:
    reader = InMemoryMetricReader()
    view = View(instrument_name="h", exemplar_reservoir_factory=lambda _: _FailingReservoir)
    series = Histogram(sdk_histogram(reader, views=[view])).series(ATTRIBUTES[0])
    for value in (0.5, 0.5, 2.0):
        with contextlib.suppress(RuntimeError):  # what the public API would raise too
            series.record(value, TIME, span_context())
    ((_, count, total, *_),) = points(reader)
    assert (count, total) == (3, 3.0)
