"""Histogram records without the SDK cleaning and hashing the same attributes again for every value.

``Histogram.record()`` costs ~10 us on these machines, most of it validating and hashing an attribute set that is
identical for every record of a series, and a stream records one value per chunk gap. A ``Series`` is one attribute
set of one histogram. For the OpenTelemetry SDK's own explicit-bucket histograms with cumulative temporality and no
attribute-filtering view, its first value goes through the public ``record()``, which creates the series'
aggregation in every reader's storage; later values are added to those aggregations directly, under their lock,
exactly as the SDK adds them: the same bucket counts, sum, min, max and exemplars (offered straight to the SDK's own
bucket-aligned reservoir, the bucket found by bisection), in a fraction of the time, and a whole stream's gaps in
one pass. Anything else (another SDK, a delta-temporality reader, a view with attribute keys or another aggregation,
an overflowed series, internals that are not the ones checked here, a reader added later, a disabled meter) takes
the public API. tests/test_recording.py checks that both paths give identical points.

Under the SDK's default exemplar filter and reservoir, direct values do not even go in at once: they wait in a
``Batch`` until a reader collects, then go in together, a series at a time. ``Batch.record`` takes a whole
operation's values over all its series as one entry (one list append under one lock); what the filter makes of
each is decided then, from the span context kept with it (not the Context, which would keep the span alive). A reader
calls every observable instrument's callbacks before it reads its aggregations; ours call ``flush_all``. Of the
exemplars offered meanwhile a series keeps the last per bucket, the one the SDK's bucket-aligned reservoir would
keep. A batch holds at most ``LIMIT`` values: the record that fills it adds them all. One flush runs at a time, so a
collection also waits for values another thread is adding. Known gap: a meter disabled at run time (the SDK's
experimental meter configurator) calls no callbacks, so what waited then goes in only when a series of it records
again, when another meter's reader collects, or when the meter is enabled again.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from functools import reduce
from itertools import repeat
from math import inf
from operator import add, truediv
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context

from otel_llm._safety import report_failure, reraise_if_signalled

_log = logging.getLogger("otel_llm")
_NS = 1e9
# A context without a sampled span, for values that must not become exemplars. Not an empty Context: the SDK would
# take the current one (the caller's span) in its place.
_NO_EXEMPLAR = trace.set_span_in_context(trace.INVALID_SPAN)

try:
    from opentelemetry.sdk.metrics import (
        AlignedHistogramBucketExemplarReservoir,
        AlwaysOffExemplarFilter,
        TraceBasedExemplarFilter,
    )
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _hash_attributes
    from opentelemetry.sdk.metrics._internal.aggregation import _ExplicitBucketHistogramAggregation
    from opentelemetry.sdk.metrics._internal.measurement import Measurement

    _INTERNALS = True
    # the SDK's filters that never sample a value recorded without a sampled span (exactly these: a subclass may
    # look at more): of a batch, only its exemplar is offered, and the span's sampled flag decides
    _CONTEXT_ONLY_FILTERS: tuple[type, ...] = (TraceBasedExemplarFilter, AlwaysOffExemplarFilter)
except ImportError:  # another SDK, or a release that moved them: the public API only
    _INTERNALS = False


# One value of an operation for one series: (series, value, whether it carries the operation's span)
Point = tuple["Series", float, bool]
# A series' values in nanoseconds, recorded in seconds (a stream's chunk gaps), and the one value that carries the
# operation's span (the first equal to it; -1 for none)
NsPoint = tuple["Series", Sequence[int], int]
# What waits: the points of one record, its time, the span context its exemplars would link to (not the Context:
# that would keep the span alive until the next collection)
_Entry = tuple[Sequence[Point], Sequence[NsPoint], int, Any]
# An exemplar a flush offers a bucket's reservoir: value, time, span context
_Offer = tuple[float, int, Any]


class Batch:
    """Values of direct series waiting for the next collection (see the module's docstring)."""

    LIMIT = 4096

    def __init__(self) -> None:
        _BATCHES.add(self)
        # Reentrant, both: a garbage collection while we hold one may run a finalizer that records on this very
        # thread (ours write later, see Telemetry.abandon; an application's own may not).
        self._lock = threading.RLock()  # what waits: held for list operations only
        # one flush at a time, held while it adds: a reader collecting while another thread adds a full batch waits
        # for those values, and values go in in the order they were taken
        self._flush_lock = threading.RLock()
        self._entries: list[_Entry] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def record(self, points: Sequence[Point], time_ns: int, context: Context,
               ns_points: Sequence[NsPoint] = (), span: Any = None) -> None:
        """Each point as ``series.record(value, time_ns, context if it carries the span else None)``, each of
        ``ns_points`` as ``series.record_ns(values, time_ns, context, exemplar)``, for series of one meter's
        histograms; the values are not changed afterwards. When every series waits in the batch (the common case)
        they wait as one entry, their exemplars chosen at the flush: one lock and one append per operation.
        ``span``: the span ``context`` holds, when the caller has it at hand (not looked up again then)."""
        first = points[0][0] if points else ns_points[0][0] if ns_points else None
        consumer = first._owner._consumer if first is not None else None
        if consumer is not None and first._owner._histogram._is_enabled():  # type: ignore[union-attr]
            count = _waiting_count(points, ns_points, consumer._reader_storages)
            if count is not None:
                if count:
                    linked = _span_context(context) if span is None else _linked(span)
                    self._put((points, ns_points, time_ns, linked), count)
                return
        for series, value, exemplary in points:  # one at a time, each the way its series takes values
            series.record(value, time_ns, context if exemplary else None)
        for series, values, exemplar in ns_points:
            series.record_ns(values, time_ns, context, exemplar)

    def _put(self, entry: _Entry, count: int) -> None:
        # Nothing under the lock allocates an object the garbage collector tracks, so no finalizer runs in here;
        # one may run in flush() (which allocates), and its record re-enters this lock on the same thread.
        with self._lock:
            _WAITING.add(self)
            self._entries.append(entry)
            self._count += count
            full = self._count >= self.LIMIT
        if full:
            self.flush()

    def flush(self) -> None:
        """Add every waiting value to its series' aggregations."""
        fresh: list[_Entry] = []  # made before: an allocation in between may run a finalizer that flushes
        with self._flush_lock:
            with self._lock:
                entries, self._entries, self._count = self._entries, fresh, 0
            # series -> its values in order, and the last exemplar offered per bucket; local, so that a finalizer's
            # record flushing on this thread meanwhile adds only its own
            taken: defaultdict[Series, tuple[list[float], dict[int, _Offer]]] = defaultdict(_values_and_offers)
            for points, ns_points, time_ns, span_context in entries:
                # all the SDK's default filter asks of a value (AlwaysOff, the other filter that lets values wait,
                # samples none)
                traced = span_context is not None and span_context.trace_flags.sampled
                for series, value, exemplary in points:
                    values, offers = taken[series]
                    values.append(value)
                    if exemplary and traced and series._trace_based:
                        offers[bisect_left(series._boundaries, value)] = (value, time_ns, span_context)
                for series, values_ns, exemplar_ns in ns_points:
                    if values_ns:
                        values, offers = taken[series]
                        values += map(truediv, values_ns, repeat(_NS, len(values_ns)))
                        if exemplar_ns >= 0 and traced and series._trace_based:
                            exemplar = exemplar_ns / _NS
                            offers[bisect_left(series._boundaries, exemplar)] = (exemplar, time_ns, span_context)
            for series, (values, offers) in taken.items():
                series._add_batch(values, offers)
            with self._lock:  # let go once in: until then a collection must find it, and wait for it
                _WAITING.discard(self)
                if self._entries:  # put since (by a finalizer's record on this thread: _put() adds it back too)
                    _WAITING.add(self)


# The batches with values waiting, held strongly until they are in: a collection flushes them all. The SDK hands
# back an instrument already made under a name and drops the callbacks that came with the new one, so the callback
# that runs may be another batch's (an earlier instrument() on the same meter, or a proxy meter's gauges forwarded
# to it); values of another meter provider just go in before its own reader collects. Changed under a batch's lock,
# read whole: each set operation is atomic, and a lock of its own would be one more to take in opposite orders.
_WAITING: set[Batch] = set()
_BATCHES: weakref.WeakSet[Batch] = weakref.WeakSet()  # every batch, for a child process to renew their locks


def _renew_locks() -> None:
    """In a child process: a lock another thread of the parent held at the fork would stay held for good."""
    for batch in list(_BATCHES):
        batch._lock._at_fork_reinit()  # type: ignore[attr-defined]
        batch._flush_lock._at_fork_reinit()  # type: ignore[attr-defined]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks)


def _waiting_count(points: Sequence[Point], ns_points: Sequence[NsPoint], storages: Any) -> int | None:
    """How many values wait in the batch, if every series takes them there (batched, of the reader storages the
    meter has now), each a value the public API would take: negative, infinite and NaN values it warns of and
    drops. None otherwise. Plain loops: generators cost more than the checks."""
    for series, value, _ in points:
        if not (series._batched and series._storages is storages and 0 <= value < inf):
            return None
    count = len(points)
    for series, values, _ in ns_points:
        if not (series._batched and series._storages is storages and (not values or min(values) >= 0)):
            return None
        count += len(values)
    return count


def _span_context(context: Context | None) -> Any:
    """What a waiting value keeps of its context: the span context its exemplar would link to (see _linked). None
    for none."""
    return None if context is None else _linked(trace.get_current_span(context))


def _linked(span: Any) -> Any:
    """The span context an exemplar of that span would link to; None for the invalid span, which the SDK's filter
    and reservoir pass over."""
    return None if span is trace.INVALID_SPAN else span.get_span_context()


def _values_and_offers() -> tuple[list[float], dict[int, _Offer]]:
    return [], {}


def _context(span_context: Any) -> Context:
    """A Context holding only the span of that span context, for a reservoir's offer (it reads the ids)."""
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context), Context())


def flush_all() -> None:
    """Add every batch's waiting values: call first in a callback of one of our observable instruments."""
    for batch in _WAITING.copy():
        try:
            batch.flush()
        except Exception:
            report_failure("adding histogram values")


class Histogram:
    """One histogram instrument; ``series()`` gives the handle for one attribute set."""

    # attribute sets whose handles are kept: just over the SDK's own cardinality limit (2000), past which a set's
    # values go to the SDK's overflow series, which is never added to directly
    MAX_SERIES = 2048

    def __init__(self, histogram: Any, batch: Batch) -> None:
        self._histogram = histogram
        self._batch = batch
        # None once the direct path is off for good (not the SDK we know, or it failed)
        self._consumer: Any = getattr(histogram, "_measurement_consumer", None) if _INTERNALS else None
        self._series: dict[frozenset[tuple[str, Any]], Series] = {}

    def series(self, attributes: Mapping[str, Any]) -> Series:
        """The one handle of an attribute set, so that values of one SDK aggregation wait in one list, in the order
        they were recorded. Past ``MAX_SERIES`` sets (unbounded attribute values) a handle is not kept, and never
        puts values in the batch: two of one set may then exist, and must add what they get at once."""
        key = frozenset(attributes.items())
        found = self._series.get(key)
        if found is None:
            if len(self._series) >= self.MAX_SERIES:
                return Series(self, dict(attributes), batched=False)
            found = self._series.setdefault(key, Series(self, dict(attributes)))  # one, if two threads race
        return found

    def _off(self) -> None:
        _log.debug("otel_llm: direct histogram record failed; using the public API", exc_info=True)
        self._consumer = None
        for series in list(self._series.values()):  # no new values wait; those waiting take the public API
            series._batched = False


class Series:
    __slots__ = ("_aggregations", "_batched", "_boundaries", "_context_only", "_filter", "_may_batch", "_owner",
                 "_reservoirs", "_storages", "_trace_based", "attributes")

    def __init__(self, owner: Histogram, attributes: dict[str, Any], *, batched: bool = True) -> None:
        self._owner = owner
        self.attributes = attributes
        self._aggregations: tuple[Any, ...] = ()  # empty: the public API, then look again
        self._storages: Any = None
        self._filter: Any = None
        self._context_only = True  # the filter samples only values recorded with a sampled span
        self._trace_based = False  # the filter is the SDK's default, which samples exactly those
        # the aggregations' exemplar reservoirs when they are the SDK's own bucket-aligned ones (offered to directly)
        self._reservoirs: tuple[Any, ...] | None = None
        # values go through the batch: a handle that may, a context-only filter, and aligned reservoirs that share
        # their boundaries
        self._may_batch = batched
        self._batched = False
        self._boundaries: Sequence[float] = ()

    def record(self, value: float, time_ns: int, context: Context | None = None) -> None:
        """As ``Histogram.record(value, attributes, context)``; ``time_ns`` is the exemplar's time. Without a context
        the value carries no span, so it never becomes an exemplar under the default filter."""
        aggregations = self._direct()
        if aggregations and 0 <= value < inf:  # negative, infinite and NaN values: the public API warns, drops them
            if self._batched:
                self._owner._batch._put((((self, value, True),), (), time_ns, _span_context(context)), 1)
                return
            if self._add_now(aggregations, (value,), time_ns, context, value if context is not None else None):
                return
        self._owner._histogram.record(value, self.attributes, context=_NO_EXEMPLAR if context is None else context)
        self._resolve()

    def record_ns(self, values_ns: Sequence[int], time_ns: int, context: Context, exemplar_ns: int) -> None:
        """Nanosecond values recorded in seconds, in order; the first equal to ``exemplar_ns`` (one of them, or -1
        for none) carries ``context``, the others none (so by default only that one can become an exemplar)."""
        if not values_ns:
            return
        aggregations = self._direct()
        if aggregations and min(values_ns) >= 0:
            if self._batched:
                self._owner._batch._put(((), ((self, values_ns, exemplar_ns),), time_ns, _span_context(context)),
                                        len(values_ns))
                return
            seconds = list(map(truediv, values_ns, repeat(_NS, len(values_ns))))
            if self._add_now(aggregations, seconds, time_ns, context, exemplar_ns / _NS if exemplar_ns >= 0 else None):
                return
        if aggregations:  # a value the public API drops: the others go in after what waits (or is being added on
            self._owner._batch.flush()  # another thread, which a look at len() would miss), as recorded
        record = self._owner._histogram.record
        for value in values_ns:
            record(value / _NS, self.attributes, context=context if value == exemplar_ns else _NO_EXEMPLAR)
            if value == exemplar_ns:
                exemplar_ns = -1
        self._resolve()

    def _add_now(self, aggregations: tuple[Any, ...], values: Sequence[float], time_ns: int, context: Context | None,
                 exemplar: float | None) -> bool:
        """Add the values to the aggregations at once; False if the public API must take them instead."""
        try:
            # decided before anything is added: once a value is in, it must not go through the public API too
            offers = self._offers(values, time_ns, context, exemplar)
            for aggregation in aggregations:
                if len(values) == 1:
                    _add(aggregation, values[0])
                else:
                    _add_all(aggregation, values)
        except Exception:
            reraise_if_signalled()
            self._owner._off()
            return False
        self._offer(aggregations, offers, time_ns)
        return True

    def _add_batch(self, values: list[float], offers: dict[int, _Offer]) -> None:
        """Values from the batch, in the order they were recorded; then the exemplars, as the reservoir would have
        kept them."""
        aggregations, reservoirs = self._aggregations, self._reservoirs
        if not aggregations or reservoirs is None or self._owner._consumer is None:  # readers changed meanwhile, or
            # the direct path is off: the public API knows where they go
            record = self._owner._histogram.record
            for value in values:
                record(value, self.attributes, context=_NO_EXEMPLAR)
            return
        added = 0
        try:
            for aggregation in aggregations:
                _add_all(aggregation, values)
                added += 1
            for bucket, (value, time_ns, span_context) in offers.items():
                context = _context(span_context)
                for reservoir in reservoirs:
                    with reservoir._lock:
                        reservoir._reservoir_storage[bucket].offer(value, time_ns, self.attributes, context)
        except Exception:
            reraise_if_signalled()
            self._owner._off()
            if not added:  # nothing is in yet: the public API takes them all
                self._add_batch(values, {})

    def _direct(self) -> tuple[Any, ...]:
        """The aggregations to add to, or () for the public API."""
        aggregations = self._aggregations
        if aggregations:
            consumer = self._owner._consumer
            if consumer is not None and consumer._reader_storages is self._storages \
                    and self._owner._histogram._is_enabled():
                return aggregations
            # what waits, or is being added on another thread, belongs to these aggregations
            self._owner._batch.flush()
            # readers changed, the path is off, or the meter is disabled: look again, and no value waits meanwhile;
            # unless another thread has bound the series anew since this one looked
            if self._aggregations is aggregations:
                self._aggregations, self._batched = (), False
        return ()

    def _offers(self, values: Sequence[float], time_ns: int, context: Context | None,
                exemplar: float | None) -> list[tuple[float, Context]]:
        """The values the exemplar filter samples, in order, each with its context: the first value equal to
        ``exemplar`` carries ``context``, the others none, as the public API would see them."""
        should_sample, attributes = self._filter.should_sample, self.attributes
        if self._context_only:  # only a value recorded with a sampled span can be sampled
            if exemplar is None or context is None or not should_sample(exemplar, time_ns, attributes, context):
                return []
            return [(exemplar, context)]
        offers = []
        for value in values:  # a filter that may sample any value: each, as the public API would
            value_context = _NO_EXEMPLAR
            if value == exemplar and context is not None:
                value_context, exemplar = context, None
            if should_sample(value, time_ns, attributes, value_context):
                offers.append((value, value_context))
        return offers

    def _offer(self, aggregations: tuple[Any, ...], offers: list[tuple[float, Context]], time_ns: int) -> None:
        # the series' attributes go with each exemplar as with a public record (it keeps none of them: {} at export)
        reservoirs, attributes = self._reservoirs, self.attributes
        if reservoirs is not None:
            for value, context in offers:
                for reservoir in reservoirs:
                    # what the reservoir's offer() does, its bucket found by bisection instead of a Python scan
                    bucket = bisect_left(reservoir._boundaries, value)
                    with reservoir._lock:
                        reservoir._reservoir_storage[bucket].offer(value, time_ns, attributes, context)
            return
        histogram = self._owner._histogram
        for value, context in offers:
            measurement = Measurement(value, time_ns, histogram, context, attributes)
            for aggregation in aggregations:
                aggregation._sample_exemplar(measurement, True)

    def _resolve(self) -> None:
        """After a public record: the aggregations it used for this series, where adding to them directly is safe."""
        consumer = self._owner._consumer
        if consumer is None or not self._owner._histogram._is_enabled():  # disabled: nothing to add to for now
            return
        try:
            storages = consumer._reader_storages
            found = []
            for storage in storages.values():
                for match in storage._get_or_init_view_instrument_match(self._owner._histogram):
                    if match._reset_on_collect or match._view._attribute_keys is not None:
                        return
                    aggregation = match._attributes_aggregation.get(_hash_attributes(self.attributes))
                    # absent: overflowed past the cardinality limit, or dropped
                    if type(aggregation) is not _ExplicitBucketHistogramAggregation:
                        return
                    found.append(aggregation)
            reservoirs: tuple[Any, ...] = tuple(aggregation._reservoir for aggregation in found)
            aligned = all(type(reservoir) is AlignedHistogramBucketExemplarReservoir
                          and tuple(reservoir._boundaries) == tuple(aggregation._boundaries)
                          for reservoir, aggregation in zip(reservoirs, found, strict=True))
            exemplar_filter = consumer._sdk_config.exemplar_filter
            context_only = type(exemplar_filter) in _CONTEXT_ONLY_FILTERS
            batched = self._may_batch and aligned and context_only \
                and len({tuple(reservoir._boundaries) for reservoir in reservoirs}) == 1
            # published with the aggregations last: another thread recording meanwhile sees them all or none
            self._reservoirs = reservoirs if aligned else None
            self._filter, self._context_only = exemplar_filter, context_only
            self._trace_based = type(exemplar_filter) is TraceBasedExemplarFilter
            self._boundaries = reservoirs[0]._boundaries if batched else ()
            self._batched = batched
            self._storages = storages
            self._aggregations = tuple(found)
        except Exception:
            reraise_if_signalled()
            _log.debug("otel_llm: SDK internals not as expected; histograms use the public API", exc_info=True)
            self._owner._consumer = None


def _add(aggregation: Any, value: float) -> None:
    """What the SDK's explicit-bucket aggregate() does with a value, before the exemplar."""
    with aggregation._lock:
        counts = aggregation._value
        if counts is None:
            counts = aggregation._value = aggregation._get_empty_bucket_counts()
        aggregation._sum += value
        if aggregation._record_min_max:
            if value < aggregation._min:
                aggregation._min = value
            if value > aggregation._max:
                aggregation._max = value
        counts[bisect_left(aggregation._boundaries, value)] += 1


def _add_all(aggregation: Any, values: Sequence[float]) -> None:
    """_add() for each value, in C loops: the bucket of each value counted, the sum added value by value in order
    (the same float sum as one record() each)."""
    boundaries = aggregation._boundaries
    # all made before the SDK's lock is taken: an allocation under it may run a finalizer that records into it
    buckets = iter(list(Counter(map(bisect_left, repeat(boundaries, len(values)), values)).items()))
    low, high = min(values), max(values)
    empty = aggregation._get_empty_bucket_counts() if aggregation._value is None else None
    with aggregation._lock:
        counts = aggregation._value
        if counts is None:  # a collection may have taken them since we looked
            counts = aggregation._value = empty if empty is not None else aggregation._get_empty_bucket_counts()
        for index, count in buckets:
            counts[index] += count
        aggregation._sum = reduce(add, values, aggregation._sum)
        if aggregation._record_min_max:
            aggregation._min = min(aggregation._min, low)
            aggregation._max = max(aggregation._max, high)
