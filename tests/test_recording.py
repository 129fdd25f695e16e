"""Direct histogram records give exactly the points the public API gives, and fall back to it where they must."""

from __future__ import annotations

import contextlib
import gc
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import (
    AlignedHistogramBucketExemplarReservoir,
    AlwaysOnExemplarFilter,
    ExemplarFilter,
    MeterProvider,
    SimpleFixedSizeExemplarReservoir,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics._internal import _default_meter_configurator, _disable_meter_configurator
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from otel_llm import _recording
from otel_llm import _semconv as sc
from otel_llm._recording import _NO_EXEMPLAR, Batch, Histogram, Series, flush_all

ATTRIBUTES = [{sc.REQUEST_MODEL: model, sc.SERVER_PORT: 443} for model in ("a", "b")]
TIME = 1_700_000_000_000_000_000


def span_context(parent: Any = None) -> Any:
    return trace.set_span_in_context(TracerProvider().get_tracer("t").start_span("s", context=parent), parent)


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


def direct_histogram(meter: Any, batch: Batch | None = None) -> Histogram:
    """Ours, as Telemetry makes it: its batch flushed by a callback of an observable instrument on the same meter."""
    batch = Batch() if batch is None else batch
    def flushing(options: Any) -> list[Any]:
        flush_all()
        return []

    meter.create_observable_gauge("g", callbacks=[flushing])
    return Histogram(meter.create_histogram("h", unit="s", explicit_bucket_boundaries_advisory=list(sc.CHUNK_BUCKETS)),
                     batch)


def our_histogram(reader: InMemoryMetricReader, **provider: Any) -> Histogram:
    return direct_histogram(MeterProvider(metric_readers=[reader], **provider).get_meter("t"))


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


def by_series(series: Any, value: float, context: Any = _NO_EXEMPLAR) -> None:
    series.record(value, TIME, context)


def by_operation(series: Any, value: float, context: Any = _NO_EXEMPLAR) -> None:
    series._owner._batch.record([(series, value, True)], TIME, context)


def by_series_ns(series: Any, values_ns: list[int], context: Any = _NO_EXEMPLAR, exemplar_ns: int = -1) -> None:
    series.record_ns(values_ns, TIME, context, exemplar_ns)


def by_operation_ns(series: Any, values_ns: list[int], context: Any = _NO_EXEMPLAR, exemplar_ns: int = -1) -> None:
    series._owner._batch.record([], TIME, context, [(series, values_ns, exemplar_ns)])


RECORDS = pytest.mark.parametrize("record, record_ns", [(by_series, by_series_ns), (by_operation, by_operation_ns)],
                                  ids=["Series.record", "Batch.record"])


@FILTERS
def test_direct_records_match_the_public_api(exemplar_filter: ExemplarFilter | None) -> None:
    rng = random.Random(5)
    values = [(rng.lognormvariate(-4, 1), rng.randrange(2)) for _ in range(500)]
    context = span_context()
    provider = {"exemplar_filter": exemplar_filter} if exemplar_filter else {}
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public, **provider)
    record_public(public_histogram, values, context)
    histogram = our_histogram(direct, **provider)
    series = record_direct(histogram, values, context)
    assert all(s._aggregations and s._reservoirs for s in series)  # the direct path was taken, exemplars too
    assert all(s._batched == (exemplar_filter is None) for s in series)  # the default filter's values wait
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
    series = our_histogram(direct, **provider).series(ATTRIBUTES[0])
    series.record_ns(gaps_ns[:1], TIME, _NO_EXEMPLAR, -1)  # the first value creates the series, publicly
    series.record_ns(gaps_ns[1:], TIME, context, longest)
    assert series._aggregations
    assert points(direct) == points(public)


def test_whole_operations_wait_as_one_entry_and_give_the_public_apis_points() -> None:
    """Batch.record: an operation's values over several series, some carrying its span, and its gaps in ns."""
    rng = random.Random(11)
    unsampled = trace.set_span_in_context(TracerProvider(sampler=ALWAYS_OFF).get_tracer("t").start_span("s"))
    operations = []
    for index in range(200):
        gaps_ns = [int(rng.lognormvariate(16, 1)) for _ in range(rng.randrange(0, 6))]
        context = unsampled if index % 7 == 3 else span_context()
        longest = -1 if index % 5 == 1 else max(gaps_ns, default=-1)  # some with none that links to the span
        operations.append(([(0, rng.lognormvariate(-2, 1), True), (1, float(rng.randrange(1, 500)), False),
                            (1, rng.lognormvariate(-3, 1), True)], gaps_ns, longest, context))
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public)
    for values, gaps_ns, exemplar, context in operations:
        for index, value, exemplary in values:
            public_histogram.record(value, ATTRIBUTES[index], context=context if exemplary else _NO_EXEMPLAR)
        for gap in gaps_ns:
            public_histogram.record(gap / 1e9, ATTRIBUTES[0], context=context if gap == exemplar else _NO_EXEMPLAR)
            if gap == exemplar:
                exemplar = -1
    histogram = our_histogram(direct)
    batch = histogram._batch
    series = [histogram.series(attributes) for attributes in ATTRIBUTES]
    waiting = []
    for values, gaps_ns, longest, context in operations:
        batch.record([(series[index], value, exemplary) for index, value, exemplary in values], TIME, context,
                     [(series[0], gaps_ns, longest)])
        waiting.append(len(batch._entries))
    # the first operation made both series, value by value; every later one waits as one entry
    assert waiting[1:] == list(range(waiting[0] + 1, waiting[0] + len(operations)))
    assert points(direct) == points(public)
    assert histogram._consumer is not None and all(s._batched for s in series)  # and the direct path is still on


def test_an_operation_with_a_value_the_public_api_drops_goes_value_by_value() -> None:
    """An operation with a value the public API drops (negative, NaN) takes the public API's way; one of empty
    gaps alone adds nothing."""
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public)
    histogram = our_histogram(direct)
    series = histogram.series(ATTRIBUTES[0])
    context = span_context()
    for values in ([0.5, 0.25], [0.125, -1.0], [float("nan"), 0.75]):
        for value in values:
            public_histogram.record(value, ATTRIBUTES[0], context=context)
        histogram._batch.record([(series, value, True) for value in values], TIME, context)
    assert points(direct) == points(public)
    assert points(direct)[0][1] == 4
    histogram._batch.record([], TIME, context, [(series, [], -1)])  # a stream without gaps: nothing to add
    assert not histogram._batch._entries
    assert points(direct)[0][1] == 4 and histogram._consumer is not None


class _DebugRequestsOnly(TraceBasedExemplarFilter):
    """Trace-based, and only for requests whose baggage says debug: a filter that looks at more of the Context."""

    def should_sample(self, value: float, time_unix_nano: int, attributes: Any, context: Any) -> bool:
        return baggage.get_baggage("debug", context) == "1" and super().should_sample(value, time_unix_nano,
                                                                                        attributes, context)


@RECORDS
def test_a_filter_of_its_own_sees_the_context_recorded_with(record: Any, record_ns: Any) -> None:
    """Only the SDK's own context-only filters let values wait with just a span context; a subclass is asked at
    once, with the very Context, not with what is current where a flush runs."""
    debug = span_context(baggage.set_baggage("debug", "1"))
    plain = span_context()
    values = [(0.003, debug), (0.02, plain), (0.3, debug), (0.7, plain), (0.04, debug)]
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public, exemplar_filter=_DebugRequestsOnly())
    series = our_histogram(direct, exemplar_filter=_DebugRequestsOnly()).series(ATTRIBUTES[0])
    for value, context in values:
        public_histogram.record(value, ATTRIBUTES[0], context=context)
        record(series, value, context)
    token = otel_context.attach(baggage.set_baggage("debug", "1"))  # where the collection runs
    try:
        found = points(direct)
    finally:
        otel_context.detach(token)
    assert found == points(public)
    assert len(found[0][6]) == 3  # the debug requests'


class _Failing(TraceBasedExemplarFilter):
    def should_sample(self, value: float, time_unix_nano: int, attributes: Any, context: Any) -> bool:
        if value == 0.666:
            raise RuntimeError("filter failure")
        return super().should_sample(value, time_unix_nano, attributes, context)


def test_a_filter_that_raises_costs_the_value_it_raised_on_as_with_the_sdk() -> None:
    """Not the values of other operations waiting beside it: such a filter is asked at once, as the SDK asks it."""
    context = span_context()
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public, exemplar_filter=_Failing())
    histogram = our_histogram(direct, exemplar_filter=_Failing())
    series = [histogram.series(attributes) for attributes in ATTRIBUTES]
    for _ in range(20):
        public_histogram.record(0.2, ATTRIBUTES[0], context=context)
        public_histogram.record(0.3, ATTRIBUTES[1], context=_NO_EXEMPLAR)
        histogram._batch.record([(series[0], 0.2, True), (series[1], 0.3, False)], TIME, context)
    with pytest.raises(RuntimeError):
        public_histogram.record(0.666, ATTRIBUTES[0], context=context)
    with pytest.raises(RuntimeError):
        histogram._batch.record([(series[0], 0.666, True)], TIME, context)
    assert points(direct) == points(public)
    assert [point[1] for point in points(direct)] == [20, 20]


@RECORDS
def test_a_span_context_that_is_not_valid_but_sampled_links_as_the_sdk_links_it(record: Any, record_ns: Any) -> None:
    odd = trace.set_span_in_context(trace.NonRecordingSpan(
        trace.SpanContext(0, 0, is_remote=False, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))))
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public)
    series = our_histogram(direct).series(ATTRIBUTES[0])
    for value in (0.01, 0.2):
        public_histogram.record(value, ATTRIBUTES[0], context=odd)
        record(series, value, odd)
    assert points(direct) == points(public)


@RECORDS
def test_gaps_with_a_value_the_sdk_drops_go_in_after_the_values_waiting(record: Any, record_ns: Any) -> None:
    context = span_context()
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public)
    series = our_histogram(direct).series(ATTRIBUTES[0])
    for value in (0.1, 0.21, 0.3, 0.22):  # waiting, the last two in the bucket of the longest gap
        public_histogram.record(value, ATTRIBUTES[0], context=context)
        record(series, value, context)
    gaps_ns = [250_000_000, -5, 1_000_000]
    for gap in gaps_ns:
        public_histogram.record(gap / 1e9, ATTRIBUTES[0], context=context if gap == gaps_ns[0] else _NO_EXEMPLAR)
    record_ns(series, gaps_ns, context, gaps_ns[0])
    assert points(direct) == points(public)


def test_gaps_other_than_the_longest_never_link_to_the_callers_span() -> None:
    reader = InMemoryMetricReader()
    series = our_histogram(reader).series(ATTRIBUTES[0])
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
    series = record_direct(our_histogram(direct, **provider), values, span_context())
    assert not any(s._aggregations for s in series)
    assert [point[:6] for point in points(direct)] == [point[:6] for point in points(public)]


def test_other_exemplar_reservoirs_are_added_to_at_once() -> None:
    def sampling(**histogram_options: Any) -> SimpleFixedSizeExemplarReservoir:
        return SimpleFixedSizeExemplarReservoir(size=4)

    view = View(instrument_name="h", exemplar_reservoir_factory=lambda _: sampling)
    values = [(0.001 * i, i % 2) for i in range(1, 40)]
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    record_public(sdk_histogram(public, views=[view]), values, span_context())
    series = record_direct(our_histogram(direct, views=[view]), values, span_context())
    assert all(s._aggregations and not s._batched for s in series)  # direct, without the batch
    assert [point[:6] for point in points(direct)] == [point[:6] for point in points(public)]


def test_delta_readers_take_the_public_api() -> None:
    delta = {SdkHistogram: AggregationTemporality.DELTA}
    values = [(0.001 * i, i % 2) for i in range(1, 40)]
    public = InMemoryMetricReader(preferred_temporality=delta)
    direct = InMemoryMetricReader(preferred_temporality=delta)
    record_public(sdk_histogram(public), values, _NO_EXEMPLAR)
    series = record_direct(our_histogram(direct), values, _NO_EXEMPLAR)
    assert not any(s._aggregations for s in series)
    assert points(direct) == points(public)
    for value, index in values[:5]:  # after a delta collection, still every value
        series[index].record(value, TIME, _NO_EXEMPLAR)
    assert sum(p[1] for p in points(direct)) == 5




@RECORDS
def test_a_reader_added_later_sees_every_value_after_it(record: Any, record_ns: Any) -> None:
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[first])
    series = direct_histogram(provider.get_meter("t")).series(ATTRIBUTES[0])
    for _ in range(3):
        record(series, 0.01)
    provider.add_metric_reader(second)
    record_ns(series, [20_000_000, 20_000_000])
    provider.add_metric_reader(third := InMemoryMetricReader())
    record(series, 0.03)
    assert points(first)[0][1] == 6
    assert points(second)[0][1] == 3
    assert points(third)[0][1] == 1


@RECORDS
def test_a_disabled_meter_records_nothing_and_takes_values_again_once_enabled(
        record: Any, record_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Disabled, it costs one flush (what waited goes in), not one per record; enabled again, values wait again,
    with their exemplars, and a reader added then sees only what came after it."""
    context = span_context()
    public_provider = MeterProvider(metric_readers=[public := InMemoryMetricReader()])
    public_histogram = public_provider.get_meter("t").create_histogram(
        "h", unit="s", explicit_bucket_boundaries_advisory=list(sc.CHUNK_BUCKETS))
    provider = MeterProvider(metric_readers=[direct := InMemoryMetricReader()])
    series = direct_histogram(provider.get_meter("t")).series(ATTRIBUTES[0])

    def both(value: float) -> None:
        public_histogram.record(value, ATTRIBUTES[0], context=context)
        record(series, value, context)

    def configure(configurator: Any) -> None:
        for one in (public_provider, provider):
            one._set_meter_configurator(meter_configurator=configurator)

    both(0.01)
    both(0.02)  # waits
    flushes = []
    flush = Batch.flush
    monkeypatch.setattr(Batch, "flush", lambda batch: (flushes.append(1), flush(batch))[1])
    configure(_disable_meter_configurator)
    for _ in range(5):
        both(0.03)
        record_ns(series, [20_000_000])
    assert len(flushes) == 1
    configure(_default_meter_configurator)
    for value in (0.04, 0.3, 0.05):
        both(value)
    assert series._batched  # waiting again
    later, public_later = InMemoryMetricReader(), InMemoryMetricReader()
    provider.add_metric_reader(later)
    public_provider.add_metric_reader(public_later)
    both(0.06)
    assert points(direct) == points(public)
    assert points(later) == points(public_later)
    assert points(later)[0][1] == 1


def test_values_the_sdk_refuses_are_refused_the_same_way() -> None:
    reader = InMemoryMetricReader()
    series = our_histogram(reader).series(ATTRIBUTES[0])
    for value in (0.5, 0.25, -1.0, float("nan"), float("inf"), 0.75):
        series.record(value, TIME, _NO_EXEMPLAR)
    series.record_ns([], TIME, _NO_EXEMPLAR, -1)  # a stream without gaps: nothing
    ((*_, count, total, low, high, _, _),) = points(reader)
    assert (count, total, low, high) == (3, 1.5, 0.25, 0.75)


def test_internals_that_are_not_as_expected_fall_back() -> None:
    reader = InMemoryMetricReader()
    histogram = our_histogram(reader)
    series = histogram.series(ATTRIBUTES[0])
    series.record(0.01, TIME, _NO_EXEMPLAR)
    assert series._aggregations
    series._aggregations = (object(),)  # an aggregation without the SDK's insides
    series.record(0.02, TIME, _NO_EXEMPLAR)
    series.record_ns([30_000_000], TIME, _NO_EXEMPLAR, -1)
    assert points(reader)[0][1] == 3  # nothing was lost
    assert histogram._consumer is None  # and the direct path is off for good


class _FailingReservoir(AlignedHistogramBucketExemplarReservoir):
    """An exemplar reservoir (a user's own, say) that fails on large values."""

    def offer(self, value: float, *args: Any) -> None:
        if value > 1.0:
            raise RuntimeError("reservoir failure")
        super().offer(value, *args)


def test_a_failure_after_the_value_is_in_never_counts_it_twice() -> None:
    reader = InMemoryMetricReader()
    view = View(instrument_name="h", exemplar_reservoir_factory=lambda _: _FailingReservoir)
    series = our_histogram(reader, views=[view]).series(ATTRIBUTES[0])
    for value in (0.5, 0.5, 2.0):
        with contextlib.suppress(RuntimeError):  # what the public API would raise too
            series.record(value, TIME, span_context())
    ((_, count, total, *_),) = points(reader)
    assert (count, total) == (3, 3.0)


def test_values_wait_in_the_batch_until_a_reader_collects() -> None:
    reader = InMemoryMetricReader()
    batch = Batch()
    series = direct_histogram(MeterProvider(metric_readers=[reader]).get_meter("t"), batch).series(ATTRIBUTES[0])
    for _ in range(10):
        series.record(0.01, TIME, span_context())
    series.record_ns([20_000_000] * 5, TIME, _NO_EXEMPLAR, -1)
    assert len(batch) == 14  # the first value made the series through the public API; the rest wait
    ((_, count, total, *_),) = points(reader)
    assert (count, total, len(batch)) == (15, pytest.approx(0.2), 0)


def test_a_full_batch_adds_its_values_without_waiting() -> None:
    reader = InMemoryMetricReader()
    batch = Batch()
    histogram = direct_histogram(MeterProvider(metric_readers=[reader]).get_meter("t"), batch)
    series = [histogram.series(attributes) for attributes in ATTRIBUTES]
    sizes = []
    for i in range(3 * Batch.LIMIT):
        series[i % 2].record(0.001, TIME)
        sizes.append(len(batch))
    # the first value of each series goes through the public API; the batch never holds more than LIMIT - 1
    # values and empties each time it fills
    assert max(sizes) == Batch.LIMIT - 1 and sizes[2:].count(0) == (3 * Batch.LIMIT - 2) // Batch.LIMIT
    assert [point[1] for point in points(reader)] == [3 * Batch.LIMIT // 2] * 2


def test_every_reader_sees_every_value_whichever_collects_first() -> None:
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    series = direct_histogram(MeterProvider(metric_readers=[first, second]).get_meter("t")).series(ATTRIBUTES[0])
    for _ in range(4):
        series.record(0.01, TIME, _NO_EXEMPLAR)
    assert points(second)[0][1] == 4
    series.record(0.01, TIME, _NO_EXEMPLAR)
    assert points(first)[0][1] == 5
    assert points(second)[0][1] == 5


def test_values_recorded_while_readers_collect_are_neither_lost_nor_counted_twice() -> None:
    reader = InMemoryMetricReader()
    histogram = direct_histogram(MeterProvider(metric_readers=[reader]).get_meter("t"))
    series = [histogram.series(attributes) for attributes in ATTRIBUTES]
    done = threading.Event()

    def record(index: int) -> None:
        for _ in range(20_000):
            series[index].record(0.002, TIME)
            series[index].record_ns([3_000_000, 4_000_000], TIME, _NO_EXEMPLAR, -1)

    def collect() -> None:
        while not done.is_set():
            reader.get_metrics_data()

    collector = threading.Thread(target=collect)
    recorders = [threading.Thread(target=record, args=(index % 2,)) for index in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as the interpreter lets them
    try:
        collector.start()
        for thread in recorders:
            thread.start()
        for thread in recorders:
            thread.join()
        done.set()
        collector.join()
    finally:
        sys.setswitchinterval(interval)
    for point in points(reader):
        count, total, buckets = point[1], point[2], point[5]
        assert count == 2 * 20_000 * 3 and sum(buckets) == count
        assert total == pytest.approx(2 * 20_000 * 0.009)


def test_one_attribute_set_has_one_handle_whoever_asks() -> None:
    """Values of one SDK aggregation wait in one list, so they go in in the order they were recorded."""
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    histogram = our_histogram(direct)
    first, second = histogram.series(ATTRIBUTES[0]), histogram.series(dict(reversed(ATTRIBUTES[0].items())))
    assert first is second
    values = [(0.1 + 0.001 * i, 0) for i in range(1, 40)]
    record_public(sdk_histogram(public), values, span_context())
    for index, (value, _) in enumerate(values):
        (first if index % 2 else second).record(value, TIME, span_context())
    assert [point[:6] for point in points(direct)] == [point[:6] for point in points(public)]


def test_past_the_kept_attribute_sets_handles_add_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Handles not kept may be two for one set: neither waits in the batch, so values still go in in order."""
    monkeypatch.setattr(Histogram, "MAX_SERIES", 1)
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    histogram = our_histogram(direct)
    kept = histogram.series(ATTRIBUTES[0])
    first, second = histogram.series(ATTRIBUTES[1]), histogram.series(ATTRIBUTES[1])
    assert histogram.series(ATTRIBUTES[0]) is kept and first is not second
    values = [(0.1 + 0.001 * i, i % 2) for i in range(1, 40)]
    context = span_context()
    record_public(sdk_histogram(public), values, context)
    for index, (value, series) in enumerate(values):
        handle = kept if series == 0 else first if index % 4 == 1 else second
        handle.record(value, TIME, context)
    assert kept._batched and not first._batched and not second._batched
    assert points(direct) == points(public)


def test_a_collection_waits_for_a_full_batch_another_thread_is_adding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever was recorded before a reader collects is in that collection, even while another thread is adding a
    full batch (here it takes 0.2 s over one series, while another series' value still waits to go in)."""
    reader = InMemoryMetricReader()
    histogram = our_histogram(reader)
    long, short = histogram.series(ATTRIBUTES[1]), histogram.series(ATTRIBUTES[0])
    long.record(0.01, TIME)  # each series' first value: the public API
    short.record(0.01, TIME)
    add_all = _recording._add_all
    adding = threading.Event()

    def slow_add_all(aggregation: Any, values: Any) -> None:
        if len(values) > 1:
            adding.set()
            time.sleep(0.2)  # the GIL is free: the reader collects meanwhile
        add_all(aggregation, values)

    monkeypatch.setattr(_recording, "_add_all", slow_add_all)
    long.record(0.01, TIME)
    short.record(0.01, TIME)  # waits behind the long series
    filling = threading.Thread(target=long.record_ns, args=([1_000_000] * Batch.LIMIT, TIME, _NO_EXEMPLAR, -1))
    filling.start()
    assert adding.wait(5)  # the filling thread has taken every waiting value and is adding the long series' ones
    exported = {point[0][sc.REQUEST_MODEL]: point[1] for point in points(reader)}
    filling.join()
    assert exported == {"a": 2, "b": 2 + Batch.LIMIT}


@contextlib.contextmanager
def adding_held(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The first flush to add a series' values stops there until the block ends: another thread's flush, caught
    between taking what waits and adding it, when len(batch) already reads 0."""
    add_batch, adding, release = Series._add_batch, threading.Event(), threading.Event()

    def held(series: Any, values: Any, offers: Any) -> None:
        if not adding.is_set():
            adding.set()
            release.wait(5)
        add_batch(series, values, offers)

    monkeypatch.setattr(Series, "_add_batch", held)
    yield adding
    release.set()


def test_gaps_with_a_dropped_value_wait_for_another_threads_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    older, newer = span_context(), span_context()
    public, direct = InMemoryMetricReader(), InMemoryMetricReader()
    public_histogram = sdk_histogram(public)
    histogram = our_histogram(direct)
    series = histogram.series(ATTRIBUTES[0])
    for value in (0.01, 0.3):
        public_histogram.record(value, ATTRIBUTES[0], context=older)
        series.record(value, TIME, older)
    public_histogram.record(0.3, ATTRIBUTES[0], context=newer)  # the -5 ns gap is dropped
    with adding_held(monkeypatch) as adding:
        flushing = threading.Thread(target=histogram._batch.flush)
        flushing.start()
        assert adding.wait(5)
        gaps = threading.Thread(target=series.record_ns, args=([-5, 300_000_000], TIME, newer, 300_000_000))
        gaps.start()
        gaps.join(0.2)
        assert gaps.is_alive()  # behind the older value, which is still going in
    flushing.join(5)
    gaps.join(5)
    assert points(direct) == points(public)  # the newer value's exemplar is the bucket's last


def test_a_reader_added_during_another_threads_flush_gets_none_of_its_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[first])
    histogram = direct_histogram(provider.get_meter("t"))
    series = histogram.series(ATTRIBUTES[0])
    series.record(0.01, TIME)
    series.record(0.01, TIME)  # waits
    with adding_held(monkeypatch) as adding:
        flushing = threading.Thread(target=histogram._batch.flush)
        flushing.start()
        assert adding.wait(5)
        provider.add_metric_reader(second)
        later = threading.Thread(target=series.record, args=(0.02, TIME))
        later.start()
        later.join(0.2)
    flushing.join(5)
    later.join(5)
    assert points(first)[0][1] == 3
    assert points(second)[0][1] == 1


def test_a_series_bound_anew_by_one_thread_is_not_unbound_by_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader is added. Thread A sees it, flushes, and is held before it unbinds the series; meanwhile this thread
    binds it to the new readers and an operation's value waits in the batch. A must leave that binding be: cleared,
    the waiting value would go in without its exemplar."""
    context = span_context()
    public_provider = MeterProvider(metric_readers=[public := InMemoryMetricReader()])
    public_histogram = public_provider.get_meter("t").create_histogram(
        "h", unit="s", explicit_bucket_boundaries_advisory=list(sc.CHUNK_BUCKETS))
    provider = MeterProvider(metric_readers=[direct := InMemoryMetricReader()])
    histogram = direct_histogram(provider.get_meter("t"))
    series = histogram.series(ATTRIBUTES[0])
    for value in (0.02, 0.03):
        public_histogram.record(value, ATTRIBUTES[0], context=context)
        series.record(value, TIME, context)
    public_provider.add_metric_reader(public_later := InMemoryMetricReader())
    provider.add_metric_reader(later := InMemoryMetricReader())
    flush, flushed, go = Batch.flush, threading.Event(), threading.Event()

    def held(batch: Batch) -> None:
        flush(batch)
        if threading.current_thread().name == "A" and not go.is_set():
            flushed.set()
            go.wait(5)

    sdk_histogram, recording, go_on = histogram._histogram, threading.Event(), threading.Event()
    sdk_record = type(sdk_histogram).record

    def held_record(value: float, attributes: Any = None, context: Any = None) -> None:
        if threading.current_thread().name == "A" and not go_on.is_set():
            recording.set()
            go_on.wait(5)
        sdk_record(sdk_histogram, value, attributes, context=context)

    monkeypatch.setattr(Batch, "flush", held)
    monkeypatch.setattr(sdk_histogram, "record", held_record)
    unbinding = threading.Thread(target=series.record, args=(0.004, TIME), name="A")
    unbinding.start()
    assert flushed.wait(5)
    public_histogram.record(0.2, ATTRIBUTES[0], context=_NO_EXEMPLAR)
    series.record(0.2, TIME)  # binds the series to both readers
    public_histogram.record(0.3, ATTRIBUTES[0], context=context)
    histogram._batch.record([(series, 0.3, True)], TIME, context)  # waits
    go.set()
    assert recording.wait(5)  # A is about to record its value the public way
    assert points(direct) == points(public)  # a collection now: the waiting value with its exemplar
    assert points(later) == points(public_later)
    go_on.set()
    unbinding.join(5)
    public_histogram.record(0.004, ATTRIBUTES[0], context=_NO_EXEMPLAR)
    assert points(direct) == points(public)
    assert points(later) == points(public_later)


def test_values_waiting_outlive_everything_but_the_reader() -> None:
    """A batch is held while values wait in it, even once its meter, its histograms and its handles are gone."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    series = direct_histogram(provider.get_meter("t")).series(ATTRIBUTES[0])
    for _ in range(3):
        series.record(0.01, TIME)
    del series, provider
    gc.collect()
    assert points(reader)[0][1] == 3


def test_a_finalizer_that_records_while_its_thread_holds_the_batch_does_not_hang() -> None:
    """A garbage collection at an allocation under the batch's lock may run an abandoned stream's finalizer, which
    records on the same thread into the same batch."""
    reader = InMemoryMetricReader()
    histogram = direct_histogram(MeterProvider(metric_readers=[reader]).get_meter("t"))
    series, other = histogram.series(ATTRIBUTES[0]), histogram.series(ATTRIBUTES[1])
    for handle in (series, other):
        handle.record(0.01, TIME)  # the public API: now both wait in the batch

    class Collecting(list[Any]):
        """A list whose first append, under the batch's lock, runs a finalizer that records."""

        def append(self, entry: Any) -> None:
            if not self:
                super().append(None)  # once
                other.record(0.02, TIME)
                self.remove(None)
            super().append(entry)

    histogram._batch._entries = Collecting()
    recording = threading.Thread(target=series.record, args=(0.03, TIME), daemon=True)
    recording.start()
    recording.join(5)
    assert not recording.is_alive()
    assert [point[1] for point in points(reader)] == [2, 2]


def test_a_finalizer_that_records_anywhere_in_a_full_flush_neither_loses_nor_doubles() -> None:
    """The collector may run a finalizer at any allocation, also inside the flush a full batch starts; one that
    records there (here a gc callback stands in for it) may fill the batch again and flush it nested. Tried at each
    of the first allocations of the flush in turn, with the collector run at every other allocation, at both
    parities."""
    tried = 0
    for parity in (0, 1):
        for nth in range(1, 13):  # the first allocations: taking what waits, sorting the first entries
            reader = InMemoryMetricReader()
            histogram = direct_histogram(MeterProvider(metric_readers=[reader]).get_meter("t"))
            batch, series = histogram._batch, histogram.series(ATTRIBUTES[0])
            while len(batch) < Batch.LIMIT - 1:
                series.record(0.01, TIME)
            starts, hoard = 0, []

            def finalizer(phase: str, info: dict[str, int], nth: int = nth, series: Any = series,
                          hoard: list[Any] = hoard) -> None:
                nonlocal starts
                frame: Any = sys._getframe(1)
                while frame is not None and frame.f_code is not Batch.flush.__code__:
                    frame = frame.f_back
                if frame is None:
                    return
                if phase == "stop":  # lists a collection frees would be reused: the flush's next list is made anew
                    for _ in range(4):
                        hoard.append([])
                    return
                starts += 1
                if starts == nth:
                    series.record(0.01, TIME)

            thresholds = gc.get_threshold()
            gc.callbacks.append(finalizer)
            try:
                padding = [[] for _ in range(100 + parity)]  # and no empty list left to reuse: each is made
                gc.set_threshold(1)
                series.record(0.01, TIME)  # fills the batch: this record adds it all
            finally:
                gc.set_threshold(*thresholds)
                gc.callbacks.remove(finalizer)
            del padding
            assert points(reader)[0][1] == Batch.LIMIT + 1 + (starts >= nth)
            if starts < nth:
                break
            tried += 1
    assert tried >= 20  # it did run inside the flush


def test_a_value_recorded_as_a_flush_lets_go_of_its_batch_is_still_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finalizer's record on the flushing thread, just as the flush takes its batch off the waiting set, puts
    the batch back."""
    reader = InMemoryMetricReader()
    batch = Batch()
    series = direct_histogram(MeterProvider(metric_readers=[reader]).get_meter("t"), batch).series(ATTRIBUTES[0])
    series.record(0.01, TIME)
    series.record(0.01, TIME)
    recorded = []

    class Finalizing(set[Batch]):
        def discard(self, item: Batch) -> None:
            if not recorded:
                recorded.append(True)
                series.record(0.02, TIME)
            super().discard(item)

    monkeypatch.setattr(_recording, "_WAITING", Finalizing(_recording._WAITING))
    batch.flush()
    assert recorded and points(reader)[0][1] == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads running, on purpose
def test_a_child_process_records_though_a_thread_of_its_parent_held_the_batch_at_the_fork() -> None:
    reader = InMemoryMetricReader()
    batch = Batch()
    series = direct_histogram(MeterProvider(metric_readers=[reader]).get_meter("t"), batch).series(ATTRIBUTES[0])
    series.record(0.01, TIME)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with batch._lock, batch._flush_lock:
            holding.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: record and flush, then leave at once
        code = 1
        try:
            series.record(0.02, TIME)
            batch.flush()
            code = 0
        finally:
            os._exit(code)
    release.set()
    holder.join()
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0
