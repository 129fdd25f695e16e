"""Direct histogram records give exactly the points the public API gives, and fall back to it where they must."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.trace import TracerProvider

from otel_llm import _semconv as sc
from otel_llm._recording import SeriesRecorder

ATTRIBUTES = [{sc.REQUEST_MODEL: model, sc.SERVER_PORT: 443} for model in ("a", "b")]


def record_all(recorder: Any, values: list[tuple[float, int]], context: Any) -> None:
    for value, series in values:
        recorder.record(value, ATTRIBUTES[series], context=context)


def points(reader: InMemoryMetricReader) -> list[tuple[Any, ...]]:
    data = reader.get_metrics_data()
    assert data is not None
    (metric,) = data.resource_metrics[0].scope_metrics[0].metrics
    return sorted((
        (dict(p.attributes), p.count, round(p.sum, 9), p.min, p.max, list(p.bucket_counts),
         [(e.value, e.span_id) for e in p.exemplars])
        for p in metric.data.data_points
    ), key=lambda point: str(point[0]))


def histogram(reader: InMemoryMetricReader, **provider: Any) -> Any:
    meter = MeterProvider(metric_readers=[reader], **provider).get_meter("t")
    return meter.create_histogram("h", unit="s", explicit_bucket_boundaries_advisory=list(sc.CHUNK_BUCKETS))


def test_direct_records_match_the_public_api() -> None:
    rng = random.Random(5)
    values = [(rng.lognormvariate(-4, 1), rng.randrange(2)) for _ in range(500)]
    span = TracerProvider().get_tracer("t").start_span("s")
    context = trace.set_span_in_context(span)
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    record_all(histogram(public), values, context)
    recorder = SeriesRecorder(histogram(direct))
    record_all(recorder, values, context)
    assert recorder._series and all(recorder._series.values())  # the direct path was taken
    assert points(direct) == points(public)
    # and again after a collection: cumulative series keep counting into the same aggregations
    record_all(recorder, values[:50], otel_context.Context())
    counts = [sum(1 for _, series in values + values[:50] if series == i) for i in (0, 1)]
    assert [point[1] for point in points(direct)] == counts


@pytest.mark.parametrize("provider", [
    {"views": [View(instrument_name="h", attribute_keys={sc.REQUEST_MODEL})]},
], ids=["attribute-filtering view"])
def test_views_take_the_public_api(provider: dict[str, Any]) -> None:
    values = [(0.001 * i, i % 2) for i in range(1, 40)]
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    record_all(histogram(public, **provider), values, otel_context.Context())
    recorder = SeriesRecorder(histogram(direct, **provider))
    record_all(recorder, values, otel_context.Context())
    assert not any(recorder._series.values())
    assert points(direct) == points(public)


def test_delta_readers_take_the_public_api() -> None:
    delta = {SdkHistogram: AggregationTemporality.DELTA}
    values = [(0.001 * i, i % 2) for i in range(1, 40)]
    public = InMemoryMetricReader(preferred_temporality=delta)
    direct = InMemoryMetricReader(preferred_temporality=delta)
    record_all(histogram(public), values, otel_context.Context())
    recorder = SeriesRecorder(histogram(direct))
    record_all(recorder, values, otel_context.Context())
    assert not any(recorder._series.values())
    assert points(direct) == points(public)
    record_all(recorder, values[:5], otel_context.Context())  # after a delta collection, still every value
    assert sum(p[1] for p in points(direct)) == 5


def test_a_reader_added_later_sees_every_value_after_it() -> None:
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[first])
    recorder = SeriesRecorder(provider.get_meter("t").create_histogram(
        "h", explicit_bucket_boundaries_advisory=list(sc.CHUNK_BUCKETS)))
    record_all(recorder, [(0.01, 0)] * 3, otel_context.Context())
    provider.add_metric_reader(second)
    record_all(recorder, [(0.02, 0)] * 2, otel_context.Context())
    assert points(first)[0][1] == 5
    assert points(second)[0][1] == 2


def test_internals_that_are_not_as_expected_fall_back() -> None:
    reader = InMemoryMetricReader()
    instrument = histogram(reader)
    recorder = SeriesRecorder(instrument)
    record_all(recorder, [(0.01, 0)], otel_context.Context())
    (aggregations,) = recorder._series.values()
    recorder._series[next(iter(recorder._series))] = (object(),)  # an aggregation without aggregate()
    record_all(recorder, [(0.02, 0), (0.03, 0)], otel_context.Context())
    assert recorder._consumer is None  # off for good, and nothing was lost
    assert points(reader)[0][1] == 3
    assert aggregations
