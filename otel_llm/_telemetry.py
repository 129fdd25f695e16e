"""The telemetry core: instruments made once; an Operation begins a span and, when it finishes, becomes that
span's attributes and its metric points. The only module that drives spans and meters; ``_spans`` and ``_recording``
are its ways into the SDK's span and histogram internals, each with the public API as fallback."""

from __future__ import annotations

import atexit
import contextvars
import functools
import gc
import json
import os
import random
import sys
import threading
import time
import weakref
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import Meter as SdkMeter
from opentelemetry.trace import SpanKind, Status, StatusCode

from otel_llm import _content as ct
from otel_llm import _semconv as sc
from otel_llm._operation import Operation, Request, is_cancellation
from otel_llm._recording import _NO_EXEMPLAR, Batch, Histogram, NsPoint, Point, Series, flush_all
from otel_llm._redact import exception_event
from otel_llm._safety import report_failure
from otel_llm._spans import (
    LATER,
    QUIET,
    PendingSpan,
    SpanStart,
    WaitingSpans,
    pending_span,
    set_attributes,
)
from otel_llm._version import __version__

if TYPE_CHECKING:
    from opentelemetry._logs import Logger
    from opentelemetry.metrics import Meter
    from opentelemetry.trace import Span, Tracer

    from otel_llm._settings import Settings

_NS = 1e9


# the telemetry of the instrument() round running now, if any (see _calls._begin)
_live: Telemetry | None = None


def live_telemetry() -> Telemetry | None:
    return _live


def set_live_telemetry(telemetry: Telemetry | None) -> None:
    global _live
    _live = telemetry


class Telemetry:
    def __init__(self, tracer: Tracer, meter: Meter, settings: Settings, logger: Logger | None = None) -> None:
        self.settings = settings
        # set by uninstrument(): wrappers still held somewhere (bound methods, the client's raw-response accessors)
        # then call straight through, or through the round running by then
        self.retired = False
        self._tracer = tracer
        self._span_start = SpanStart(tracer, write_waiting)
        self._logger = logger if settings.capture_content.on_event else None
        self._gap_rate = settings.chunk_gap_sample_rate
        names = settings.metric_names
        shared = _shared(meter, names)
        self._gauges = shared.gauges
        # a new round reports the headroom its own responses tell (what the last one saw may still be exported
        # until now, by the providers it was given)
        _LATEST_REMAINING.clear()
        _LATEST_LIMITS.clear()
        self._batch = shared.batch
        # what waits to be written goes out before the providers shut down at exit: atexit runs the last
        # registered first, and the providers registered theirs when they were made, before this
        atexit.unregister(_write_at_exit)
        atexit.register(_write_at_exit)

        def counter(instrument: sc.Instrument | None) -> Any:
            if instrument is None:
                return None
            return meter.create_counter(instrument.name, unit=instrument.unit, description=instrument.description)

        self._duration = shared.histogram(meter, names.duration)
        self._ttfc = shared.histogram(meter, names.time_to_first_chunk)
        self._chunk_gap = shared.histogram(meter, names.time_per_output_chunk)
        self._token_usage = shared.histogram(meter, names.token_usage)
        self._input_tokens = shared.histogram(meter, names.input_tokens)
        self._output_tokens = shared.histogram(meter, names.output_tokens)
        # input, output, cache read, cache write, reasoning: where the scheme names them all
        counters = tuple(counter(instrument) for instrument in (
            names.input_token_counter, names.output_token_counter, names.cache_read_counter,
            names.cache_write_counter, names.reasoning_counter))
        self._usage_counters = counters if None not in counters else ()
        self._tpot = shared.histogram(meter, names.time_per_output_token)
        self._prompt_length = shared.histogram(meter, names.prompt_length)
        self._embeddings_duration = shared.histogram(meter, names.embeddings_duration)
        self._embeddings_input_tokens = shared.histogram(meter, names.embeddings_input_tokens)
        # what each kind of operation records into, by _series_key()
        self._series: dict[tuple[Any, ...], _Series] = {}
        # operations handed out unfinished (streams, responses read later), by id, until they finish: for the exit
        # (see outlives). A plain dict: every one finishes, by its caller, its last proxy's finalizer, or the exit
        self._pending: dict[int, Operation] = {}
        _TELEMETRIES.add(self)
        _start_later_writer()  # last: a set-up that failed leaves no thread behind

    # --- lifecycle -------------------------------------------------------------------------------------------

    def begin(self, request: Request) -> Operation:
        """Open the span; the clock starts last, just before the caller issues the request. The span starts with
        the attributes semconv marks as relevant to sampling; the rest are set with the outcome at the finish. Under
        the SDK's batch span processor, the span is made when the operation is written (see ``_spans``)."""
        if _LATER:
            write_later()
        start = self._span_start()
        name = f"{request.operation} {request.model}" if request.model else request.operation
        start_epoch_ns = time.time_ns()
        try:
            if start == LATER and _later_writer is not None:
                span = pending_span(self._tracer, name, start_epoch_ns, functools.partial(_identity, request),
                                    _write_claimed)
            else:
                attributes = _identity(request)
                quiet = start == QUIET  # nothing at the start reads them: written just after, without the cleaning
                span = self._tracer.start_span(name, kind=SpanKind.CLIENT, attributes=None if quiet else attributes,
                                               start_time=start_epoch_ns)
                if quiet:
                    set_attributes(span, attributes, quiet_start=True)
        except Exception:  # a span processor's on_start, say: the span is lost, the metrics need not be
            report_failure("span start")
            span = trace.INVALID_SPAN
        op = Operation(request=request, start_ns=0, start_epoch_ns=start_epoch_ns, span=span,
                       context=trace.set_span_in_context(span))
        if request.stream:
            op.gaps_ns = array("q")
            op.record_gaps = self._gap_rate >= 1.0 or (self._gap_rate > 0 and random.random() < self._gap_rate)
        op.start_ns = op.last_activity_ns = time.perf_counter_ns()
        return op

    def activate(self, op: Operation) -> object:
        """Make the span current while the SDK call runs (retries, HTTP spans of other instrumentations)."""
        return otel_context.attach(op.context)

    def deactivate(self, token: object) -> None:
        otel_context.detach(token)  # type: ignore[arg-type]

    def stand_in(self, op: Operation) -> Span:
        """A span that records nothing and carries the operation's span context, for a client that would otherwise
        open a second span for the same call (see ``_calls.span_stand_in``)."""
        return trace.NonRecordingSpan(op.span.get_span_context())

    def finish(self, op: Operation, error: BaseException | str | None = None, end_ns: int | None = None,
               sealed: bool = False) -> None:
        """End the operation exactly once: ERROR status and error.type are set before the span ends. ``sealed``:
        nothing can reach the operation after this (no stream chunks the caller may still read), so a later write
        need not copy it. A span made later (``PendingSpan``) is written with the next batch, off this thread. On
        the garbage collector's stack (a finalizer, a generator or coroutine it closes, a ``with`` exit in one):
        ended now, written by the next operation or collection, as ``abandon`` does."""
        failure: dict[str, str] | None = None
        error_type: str | None
        if isinstance(error, BaseException):
            error_type = sc.ERROR_CANCELLED if is_cancellation(error) else type(error).__name__
        else:
            error_type = error
        if not op.close(time.perf_counter_ns() if end_ns is None else end_ns, error_type):
            return
        waiting: _Waiting = (self, op, None)
        try:
            self._pending.pop(id(op), None)
            if isinstance(error, BaseException):
                failure = self._failure(op, error)
            in_collector = _collector is not None and _collector == threading.get_ident()
            if type(op.span) is PendingSpan and _later_writer is not None and op.span.waits(
                    waiting := (self, op if sealed else op.snapshot(), failure)):
                _DEFERRED.append(waiting)
                if WRITE_BATCH is not None and len(_DEFERRED) >= WRITE_BATCH and not in_collector:
                    if len(_DEFERRED) >= MAX_WAITING:  # the writer thread falls behind (threads busy with the GIL)
                        write_later(_DEFERRED, WRITE_BATCH)
                    else:
                        _later_wake.set()
                return
            if in_collector:
                _LATER.append(waiting := (self, op if sealed else op.snapshot(), failure))
                return
            waiting = (self, op, failure)
            if _LATER:
                write_later()
            self._write(op, failure)
        except BaseException:
            # An interrupt (KeyboardInterrupt, a signal handler's exception) after the close: the operation is
            # written by the next call, collection or the exit. One handed off already, or whose write began, is
            # not written twice (Operation.written, PendingSpan.claim)
            _LATER.append(waiting)
            self._pending.pop(id(op), None)
            raise

    def _failure(self, op: Operation, exception: BaseException) -> dict[str, str] | None:
        """The span's exception event for what ended the operation, rendered now: its frames are not kept until
        the span is written. None for a cancellation, and where the span records nothing."""
        if is_cancellation(exception):
            return None
        try:
            if not op.span.is_recording():
                return None
            return exception_event(exception, op.secrets, hide_content=not self.settings.capture_content.on_span)
        except Exception:
            report_failure("exception")
            return None

    def outlives(self, op: Operation) -> None:
        """The operation goes on after its SDK call (a stream, a response read later): if the caller still holds it
        unfinished at exit (a script that broke out of its last stream, or died reading it), the exit finishes it
        as the garbage collector would have, which the interpreter's own shutdown leaves no time for."""
        self._pending[id(op)] = op

    def finish_pending(self) -> None:
        """At exit, before the providers shut down: every operation still held unfinished ends as abandoned where
        it was last active (without error where its response was complete), and is written."""
        for op in list(self._pending.values()):
            if self._close_abandoned(op):
                self._write(op, None)

    def abandon(self, op: Operation) -> None:
        """End an operation nobody finished, from a garbage collector's finalizer: where activity was last seen,
        not at collection time (or where its response completed, without error). The collector runs finalizers at
        any allocation, also where this thread holds a lock of the SDK's or ours, so the span and points are written
        later, on a clean stack (the next operation or collection). Not at all while the interpreter shuts down:
        the providers are shut down by then."""
        if not sys.is_finalizing() and self._close_abandoned(op):
            _LATER.append((self, op, None))

    def _close_abandoned(self, op: Operation) -> bool:
        """Close an operation nobody finished where it was last active; True only the first time."""
        if not op.close(*op.stopped_by_caller(op.last_activity(), sc.ERROR_ABANDONED)):
            return False
        self._pending.pop(id(op), None)
        return True

    def _write(self, op: Operation, failure: dict[str, str] | None) -> None:
        """Write the operation; one whose span waited is written once, by the first thread to claim it (the writer,
        or the application touching its span meanwhile: ``PendingSpan``). In a copy of the context: what the SDK's
        processors leave in it does not reach the application's (SimpleSpanProcessor's suppression of instrumentation,
        which an interrupt after its attach, before its try, never takes back)."""
        span = op.span
        if type(span) is not PendingSpan:
            if not op.written:
                op.written = True
                contextvars.copy_context().run(self._write_out, op, failure)
            return
        if not span.claim():
            return
        try:
            contextvars.copy_context().run(self._write_out, op, failure)
        finally:
            span.written()

    def _write_out(self, op: Operation, failure: dict[str, str] | None) -> None:
        """Span, metrics and event each on their own: a span processor that raises must not cost the histograms.
        Content (opt-in) is written as JSON once, for the span and the event alike."""
        # a server's id or model that is not text is left out: as a metric attribute a list would cost every point
        if not isinstance(op.response_id, str | None):
            op.response_id = None
        if not isinstance(op.response_model, str | None):
            op.response_model = None
        tpot = _time_per_output_token(op)
        on_span = self.settings.capture_content.on_span
        content = _content_attributes(op) if on_span or self._logger is not None else {}  # each part guarded
        op.output = None  # written out as JSON now: a stream the caller still holds need not keep every delta
        try:
            self._end_span(op, failure, tpot, content if on_span else {})
        except Exception:
            report_failure("span")
        try:
            self._record_metrics(op, tpot)
        except Exception:
            report_failure("metrics")
        if self._logger is not None:
            try:
                self._emit_event(op, self._logger, content)
            except Exception:
                report_failure("event")

    # --- writing ---------------------------------------------------------------------------------------------

    def _end_span(self, op: Operation, failure: dict[str, str] | None, tpot: float | None,
                  content: dict[str, str]) -> None:
        span = op.span
        end_epoch_ns = op.start_epoch_ns + (op.end_ns - op.start_ns)
        if type(span) is PendingSpan:
            if not span.recording():  # sampled out: nothing was made, so nothing ends
                return
        elif not span.is_recording():  # sampled out
            span.end(end_time=end_epoch_ns)
            return
        request = op.request
        attributes: dict[str, Any] = {sc.REQUEST_STREAM: request.stream}
        if request.prompt_chars is not None:
            attributes[sc.PROMPT_LENGTH] = request.prompt_chars
        if request.attributes:
            attributes.update(request.attributes)
        if op.response_id is not None:
            attributes[sc.RESPONSE_ID] = op.response_id
        if op.response_model is not None:
            attributes[sc.RESPONSE_MODEL] = op.response_model
        if op.finish_reasons:
            attributes[sc.RESPONSE_FINISH_REASONS] = tuple(op.finish_reasons)
        for key, value in (
            (sc.USAGE_INPUT_TOKENS, op.input_tokens),
            (sc.USAGE_OUTPUT_TOKENS, op.output_tokens),
            (sc.USAGE_CACHE_READ_INPUT_TOKENS, op.cache_read_tokens),
            (sc.USAGE_CACHE_CREATION_INPUT_TOKENS, op.cache_creation_tokens),
            (sc.USAGE_REASONING_OUTPUT_TOKENS, op.reasoning_tokens),
            (sc.RETRY_AFTER, op.retry_after),
        ):
            if value is not None:
                attributes[key] = value
        if request.stream:
            chunks = attributes[sc.CONTENT_CHUNKS] = op.content_chunks
            if op.first_content_ns:
                attributes[sc.RESPONSE_TIME_TO_FIRST_CHUNK] = (op.first_content_ns - op.start_ns) / _NS
            if chunks > 1:
                attributes[sc.MAX_CHUNK_GAP] = op.max_gap_ns / _NS
            if tpot is not None:
                attributes[sc.TIME_PER_OUTPUT_TOKEN] = tpot
        if op.headers_ns:
            attributes[sc.TIME_TO_HEADERS] = (op.headers_ns - op.start_ns) / _NS
        if op.retries:
            attributes[sc.RETRIES] = op.retries
        if op.hide_usage_chunk:
            attributes[sc.USAGE_INJECTED] = True
        for resource, (remaining, limit) in op.rate_limits.items():
            remaining_key, limit_key = _RATE_LIMIT_ATTRIBUTES.get(resource) or _rate_limit_attributes(resource)
            if remaining is not None:
                attributes[remaining_key] = remaining
            if limit is not None:
                attributes[limit_key] = limit
        if op.attributes:
            attributes.update(op.attributes)
        if content:
            attributes.update(content)
        status: Status | None = None
        if op.error_type is not None:
            attributes[sc.ERROR_TYPE] = op.error_type
            status = Status(StatusCode.ERROR, op.error_type)
        else:
            failure = None
        if type(span) is PendingSpan:
            if span.end_written(attributes, status, failure, end_epoch_ns):
                return
            span = span.make()
        if status is not None:
            span.set_status(status)
            if failure is not None:
                span.add_event("exception", failure, timestamp=end_epoch_ns)
        set_attributes(span, attributes)
        span.end(end_time=end_epoch_ns)

    def _emit_event(self, op: Operation, logger: Logger, content: dict[str, str]) -> None:
        """Content as a log event beside the span (opt-in): sized for a log pipeline, not span attributes. The
        conventions require the structured values on events (the JSON strings are for spans): the same JSON, read
        back into lists and maps."""
        attributes: dict[str, Any] = dict(_identity(op.request))
        if op.response_id is not None:
            attributes[sc.RESPONSE_ID] = op.response_id
        attributes.update((key, json.loads(value)) for key, value in content.items())
        logger.emit(event_name=sc.EVENT_OPERATION_DETAILS, attributes=attributes, context=op.context,
                    timestamp=op.start_epoch_ns + (op.end_ns - op.start_ns))

    def _record_metrics(self, op: Operation, tpot: float | None) -> None:
        request = op.request
        key = _series_key(op)
        series = self._series.get(key) or self._new_series(key, op)
        if op.rate_limits:
            keys, arrived_ns = series.rate_limit_keys, op.rate_limits_ns
            with _LATEST_LOCK:  # compare and store as one against other threads (a signal handler may re-enter)
                for resource, (remaining, limit) in op.rate_limits.items():
                    gauge_key = (self._gauges, keys.get(resource) or series.rate_limit_key(resource))
                    for value, latest in ((remaining, _LATEST_REMAINING), (limit, _LATEST_LIMITS)):
                        if value is None:
                            continue
                        previous = latest.get(gauge_key)
                        if previous is None:
                            if len(latest) >= _MAX_LATEST:
                                del latest[next(iter(latest))]  # the series first seen: one in use comes back
                        elif arrived_ns < previous[1]:
                            continue
                        latest[gauge_key] = (value, arrived_ns)
        # exemplars link a slow latency bucket to its trace; counts (prompt length, tokens) carry none
        points: list[Point] = [(series.duration, (op.end_ns - op.start_ns) / _NS, True)]
        gaps: tuple[NsPoint, ...] = ()
        if request.prompt_chars is not None:
            points.append((series.prompt_length, request.prompt_chars, False))
        if request.stream:
            if op.first_content_ns:
                points.append((series.time_to_first_chunk, (op.first_content_ns - op.start_ns) / _NS, True))
            if op.record_gaps and op.gaps_ns:  # the longest gap links to the trace
                gaps = ((series.chunk_gap, op.gaps_ns, op.max_gap_ns),)
            if tpot is not None:
                points.append((series.time_per_output_token, tpot, True))
        for count, usage, histogram in ((op.input_tokens, series.input_usage, series.input_tokens),
                                        (op.output_tokens, series.output_usage, series.output_tokens)):
            if count is None:
                continue
            if usage is not None:
                points.append((usage, count, False))
            if histogram is not None:
                points.append((histogram, count, False))
        if series.usage_counters:
            # Every operation counts, a failed one too: 0 where the provider reported none. Adding 0 to a sum
            # changes nothing once its series exists, so a series' first 0 is added and the others are not (a
            # Counter.add() costs ~9 us here, and most calls report no cache writes or reasoning).
            added = series.counters_added
            for index, (count, counter) in enumerate(zip(
                    (op.input_tokens, op.output_tokens, op.cache_read_tokens, op.cache_creation_tokens,
                     op.reasoning_tokens), series.usage_counters, strict=True)):
                if count or not added[index]:
                    added[index] = True
                    counter.add(count or 0, series.counted, context=_NO_EXEMPLAR)
        self._batch.record(points, op.start_epoch_ns + (op.end_ns - op.start_ns), op.context, gaps, op.span)

    def _new_series(self, key: tuple[Any, ...], op: Operation) -> _Series:
        if len(self._series) >= _MAX_SERIES_KINDS:  # unbounded model names: start over rather than grow
            self._series.clear()
        identity = _identity(op.request)
        attributes = dict(identity)
        if op.response_model is not None:
            attributes[sc.RESPONSE_MODEL] = op.response_model
        if op.error_type is not None:
            attributes[sc.ERROR_TYPE] = op.error_type
        timing = {**attributes, sc.REQUEST_STREAM: op.request.stream}
        if op.request.prompt_chars is not None:
            timing[sc.PROMPT_SIZE] = sc.prompt_size_class(op.request.prompt_chars)

        def usage(token_type: str) -> Series | None:
            if self._token_usage is None:
                return None
            return self._token_usage.series({**attributes, sc.TOKEN_TYPE: token_type})

        def split(histogram: Histogram | None) -> Series | None:
            return histogram.series(attributes) if histogram is not None else None

        # embeddings into their own instruments where the scheme names them, and into no inference usage
        embeddings = op.request.operation == sc.OP_EMBEDDINGS and self._embeddings_duration is not None
        series = _Series(
            identity=identity,
            attributes=attributes,
            counted={**attributes, sc.TOKEN_MODALITY: sc.TOKEN_MODALITY_UNKNOWN},
            duration=_required(self._embeddings_duration if embeddings else self._duration).series(timing),
            time_to_first_chunk=_required(self._ttfc).series(timing),
            chunk_gap=_required(self._chunk_gap).series(attributes),
            time_per_output_token=_required(self._tpot).series(attributes),
            prompt_length=_required(self._prompt_length).series(attributes),
            input_usage=usage(sc.TOKEN_INPUT),
            output_usage=usage(sc.TOKEN_OUTPUT),
            input_tokens=split(self._embeddings_input_tokens if embeddings else self._input_tokens),
            output_tokens=None if embeddings else split(self._output_tokens),
            usage_counters=() if embeddings else self._usage_counters,
            counters_added=[False] * len(self._usage_counters),
        )
        self._series[key] = series
        return series


# resource -> its span attributes (remaining, limit), named once: the few resources providers' headers name
_RATE_LIMIT_ATTRIBUTES: dict[str, tuple[str, str]] = {}


def _rate_limit_attributes(resource: str) -> tuple[str, str]:
    names = _RATE_LIMIT_ATTRIBUTES[resource] = (sc.RATE_LIMIT_REMAINING_PREFIX + resource,
                                                sc.RATE_LIMIT_LIMIT_PREFIX + resource)
    return names


# Kinds of operation (attribute sets) whose series are kept resolved; the SDK's own cardinality limit is 2000
_MAX_SERIES_KINDS = 4096


# Rate-limit headroom changes on every response but is read once per export: the latest values wait here (a dict
# store per operation) and the SDK observes them when it collects. Latest by the time the response arrived, not the
# time its operation finished: a long stream must not overwrite newer 429s. One store for the process: of the gauges
# made under one name on one meter, the SDK keeps the first (an earlier instrument()'s, or those the API's proxy
# meter forwarded when the application set its provider) and drops the others. So each value is kept with the meter
# it was recorded for, found when the gauges are read (``_Gauges``), and a gauge reports the values of its own
# meter: not those of a later instrument() that records to another provider.
_GaugeKey = tuple["_Gauges", frozenset[tuple[str, Any]]]
_LATEST_REMAINING: dict[_GaugeKey, tuple[float, int]] = {}
_LATEST_LIMITS: dict[_GaugeKey, tuple[float, int]] = {}


class _Gauges:
    """Which meter the rate-limit values of one _Shared go to: an SDK meter itself, or for the API's proxy meter the
    meter the proxy forwards to once the application sets its provider (the global provider's, for our scope)."""

    __slots__ = ("_meter",)

    def __init__(self, meter: Any) -> None:
        self._meter = weakref.ref(meter) if isinstance(meter, SdkMeter) else None

    def meter(self) -> Any:
        if self._meter is not None:
            return self._meter()
        return metrics.get_meter_provider().get_meter(sc.INSTRUMENTATION_SCOPE, __version__)
# series per store: the SDK's own limit per instrument (it drops the rest), so model names without end cannot grow
# the stores or the work of every collection
_MAX_LATEST = 2000
_LATEST_LOCK = threading.RLock()  # re-entrant: a signal handler may finish an operation while this thread holds it


class _Shared:
    """What every Telemetry on one meter shares (instrument(), uninstrument(), instrument() again). The SDK hands back
    the instrument already made under a name and drops the callbacks that came with the new one, so the rate-limit
    gauges and the batch their callbacks flush are made once per meter; histogram handles too, so that one attribute
    set keeps one handle and its values stay in the order they were recorded."""

    def __init__(self, meter: Meter, names: sc.MetricNames) -> None:
        # histogram values wait here until a reader collects: the gauges' callbacks flush every batch first
        self.batch = Batch()
        self._histograms: dict[str, Histogram] = {}
        self.gauges = _Gauges(meter)
        for instrument, latest in ((names.rate_limit_remaining, _LATEST_REMAINING),
                                   (names.rate_limit_limit, _LATEST_LIMITS)):
            meter.create_observable_gauge(instrument.name, callbacks=[_observe_latest(latest, self.gauges)],
                                          unit=instrument.unit, description=instrument.description)

    def histogram(self, meter: Meter, instrument: sc.Instrument | None) -> Histogram | None:
        """The meter's histogram of that name (the meter is not kept: it is this object's key in _SHARED)."""
        if instrument is None:
            return None
        found = self._histograms.get(instrument.name)
        if found is None:
            found = self._histograms[instrument.name] = Histogram(meter.create_histogram(
                instrument.name, unit=instrument.unit, description=instrument.description,
                explicit_bucket_boundaries_advisory=list(instrument.buckets),
            ), self.batch)
        return found


_SHARED: weakref.WeakKeyDictionary[Any, _Shared] = weakref.WeakKeyDictionary()
# every Telemetry still referred to, for what the exit finishes
_TELEMETRIES: weakref.WeakSet[Telemetry] = weakref.WeakSet()

# What waits to be written: an operation, with its span's exception event
_Waiting = tuple[Telemetry, Operation, "dict[str, str] | None"]
# Operations ended where nothing may be written (a garbage collector's finalizer): the next operation writes them
_LATER: deque[_Waiting] = deque()
# Operations whose spans are made when written (PendingSpan): the writer thread writes them in batches of WRITE_BATCH
# (one span made between others costs a fraction of one made between milliseconds of client work), or within
# LATER_WAIT_S; so do a collection, the provider's flush or shutdown (WaitingSpans), uninstrument() and the exit
_DEFERRED: deque[_Waiting] = deque()
WRITE_BATCH: int | None = 32
# what waits for the writer thread at most: beyond it, a finishing thread writes a batch itself
MAX_WAITING = 1024
# The garbage collector runs finalizers at any allocation, also where the thread holds a lock of the SDK's or ours:
# nothing is written on the thread it runs on while it runs (one collection runs at a time). Other threads, which
# may run while a finalizer waits on I/O, write as usual.
_collector: int | None = None


def _note_collection(phase: str, info: dict[str, int]) -> None:
    global _collector
    _collector = threading.get_ident() if phase == "start" else None


gc.callbacks.append(_note_collection)


def write_later(waiting: deque[_Waiting] = _LATER, limit: int | None = None) -> None:
    """Write the spans and points of the operations ended where nothing could be (or of those ``waiting``; at most
    ``limit``)."""
    while waiting and (limit is None or limit > 0):
        if limit is not None:
            limit -= 1
        try:
            item = waiting.popleft()
        except IndexError:  # another thread took the last
            return
        try:
            item[0]._write(item[1], item[2])
        except BaseException:  # an interrupt: back for the next write (begun already, it is not begun again)
            waiting.appendleft(item)
            raise


def _write_claimed(waiting: object) -> None:
    """What waited to be written, claimed by the thread that touched its span (``PendingSpan.claim``)."""
    telemetry, op, failure = cast("_Waiting", waiting)
    try:
        contextvars.copy_context().run(telemetry._write_out, op, failure)
    finally:
        op.span.written()


def write_all() -> None:
    """Write all that waits: what was ended where nothing could be written, and what waits for the writer thread."""
    write_later()
    write_later(_DEFERRED)


def write_waiting(timeout_s: float | None = None) -> None:
    """Write all that waits, then give the writer thread up to ``timeout_s`` (None: _EXIT_WAIT_S) to write what it
    took off the queues already."""
    write_all()
    _later_idle.wait(_EXIT_WAIT_S if timeout_s is None else timeout_s)


# How long what waits may wait for the next call or collection before a thread of ours writes it (None: no limit)
LATER_WAIT_S: float | None = 1.0
_later_wake = threading.Event()  # set to make the writer thread look at LATER_WAIT_S again
_later_idle = threading.Event()  # clear while the writer thread writes
_later_idle.set()
# the writer thread and what stops it; None while not instrumented
_later_writer: tuple[threading.Thread, threading.Event] | None = None
_later_lock = threading.Lock()


def _write_later_in_time(stop: threading.Event) -> None:
    """The batches of operations whose spans wait, when one is full; and at least every LATER_WAIT_S what waits
    (a service with no more calls to make and no metric reader would otherwise see it only at exit), until
    uninstrument() stops it."""
    while not stop.is_set():
        _later_wake.wait(LATER_WAIT_S)
        _later_wake.clear()
        if _LATER or _DEFERRED:
            _later_idle.clear()
            try:
                write_all()
            finally:
                _later_idle.set()


def _write_at_exit() -> None:
    """What waits goes out before the providers shut down, and so does what the writer thread is writing now: it
    took it off the queue, and would be stopped mid-write once the exit is done. So do the operations still held
    unfinished (see Telemetry.outlives)."""
    write_all()
    for telemetry in list(_TELEMETRIES):
        try:
            telemetry.finish_pending()
        except Exception:
            report_failure("exit")
    _later_idle.wait(_EXIT_WAIT_S)


_EXIT_WAIT_S = 5.0


def _start_later_writer() -> None:
    global _later_writer
    with _later_lock:
        if _later_writer is None or not _later_writer[0].is_alive():
            stop = threading.Event()
            thread = threading.Thread(target=_write_later_in_time, args=(stop,), name="otel_llm-writer",
                                      daemon=True)
            thread.start()
            _later_writer = thread, stop


def stop_later_writer() -> None:
    """uninstrument(): the process goes back to no thread of ours, and the providers to their own span processors.
    Spans waiting to be made are written first; an operation of this round still under way writes its own at its
    finish. (What a finalizer ended is written by the next collection or the exit.)"""
    global _later_writer
    with _later_lock:
        if _later_writer is not None:
            _later_writer[1].set()
            _later_wake.set()
            _later_writer = None
    write_later(_DEFERRED)
    _later_idle.wait(_EXIT_WAIT_S)
    WaitingSpans.uninstall()


def _after_fork() -> None:
    """In a forked child: what waits is the parent's to write (the SDK's span processors drop their queues too), and
    so are the operations still under way: the parent finishes its own streams, and a copy the child ended too (read
    on, dropped, or left at its exit) would be a second span of the same call. Threads do not survive a fork, so a
    writer that ran needs a new one, with a fresh event."""
    global _later_writer, _later_wake, _later_idle, _later_lock, _LATEST_LOCK
    _LATER.clear()
    _DEFERRED.clear()
    for telemetry in list(_TELEMETRIES):
        for op in telemetry._pending.values():
            op.finished = True  # its proxies in the child's memory leave it alone (see Operation.close)
        telemetry._pending.clear()
    _later_lock = threading.Lock()  # another thread may have held it at the fork
    _LATEST_LOCK = threading.RLock()
    if _later_writer is not None:
        _later_wake, _later_idle = threading.Event(), threading.Event()
        _later_idle.set()
        _later_writer = None
        _start_later_writer()


os.register_at_fork(after_in_child=_after_fork)


def _shared(meter: Meter, names: sc.MetricNames) -> _Shared:
    if not isinstance(meter, SdkMeter):  # the API's proxy meter (a new one per get_meter, all kept by its
        return _Shared(meter, names)  # provider) or another SDK's: its own, as before
    found = _SHARED.get(meter)
    if found is None:
        found = _SHARED[meter] = _Shared(meter, names)
    return found


@dataclass(slots=True)
class _Series:
    """The series one kind of operation records into, resolved once: the kind is what names a metric point
    (identity, response model, outcome; and for duration and TTFT whether it streamed and its prompt size)."""

    identity: dict[str, Any]
    attributes: dict[str, Any]  # identity, response model, error type
    counted: dict[str, Any]  # the token counters': those, and the tokens' modality
    duration: Series
    time_to_first_chunk: Series
    chunk_gap: Series
    time_per_output_token: Series
    prompt_length: Series
    input_usage: Series | None
    output_usage: Series | None
    input_tokens: Series | None
    output_tokens: Series | None
    usage_counters: tuple[Any, ...]  # SDK Counters: input, output, cache read, cache write, reasoning; or none
    counters_added: list[bool]  # whether each of usage_counters has a value yet
    # rate-limit gauges describe the endpoint and model, not one call's outcome: resource -> the gauge's key
    rate_limit_keys: dict[str, frozenset[tuple[str, Any]]] = field(default_factory=dict)

    def rate_limit_key(self, resource: str) -> frozenset[tuple[str, Any]]:
        key = frozenset((*self.identity.items(), (sc.RATE_LIMIT_RESOURCE, resource)))
        self.rate_limit_keys[resource] = key
        return key


def _series_key(op: Operation) -> tuple[Any, ...]:
    request = op.request
    chars = request.prompt_chars
    return (request.operation, request.provider, request.model, request.server_address, request.server_port,
            request.stream, None if chars is None else sc.prompt_size_class(chars), op.response_model, op.error_type)


def _required(histogram: Histogram | None) -> Histogram:
    assert histogram is not None  # every naming scheme has it
    return histogram


def _observe_latest(latest: dict[_GaugeKey, tuple[float, int]], gauges: _Gauges) -> Callable[
        [CallbackOptions], Iterable[Observation]]:
    """A gauge's callback. A reader calls it before it reads the aggregations: first what waits to be written, then
    every batch of histogram values (those values included) goes in; then the latest values recorded for its meter."""
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        write_all()
        flush_all()
        mine = gauges.meter()
        meters: dict[_Gauges, Any] = {}  # each owner's meter, resolved once per collection
        observed = []
        for (whose, key), (value, _) in list(latest.items()):
            if whose not in meters:
                meters[whose] = whose.meter()
            if meters[whose] is mine:
                observed.append(Observation(value, dict(key)))
        return observed

    return observe


def _identity(request: Request) -> dict[str, Any]:
    """What names the operation on every span and metric point: operation, provider, model, server."""
    attributes: dict[str, Any] = {sc.OPERATION_NAME: request.operation, sc.PROVIDER_NAME: request.provider}
    if request.model is not None:
        attributes[sc.REQUEST_MODEL] = request.model
    if request.server_address is not None:
        attributes[sc.SERVER_ADDRESS] = request.server_address
    if request.server_port is not None:
        attributes[sc.SERVER_PORT] = request.server_port
    return attributes


def _time_per_output_token(op: Operation) -> float | None:
    """True TPOT: the spread of content chunks over the streamed tokens after the first; unknown without a token
    count, and with one content chunk (however many tokens it holds, their spread in time cannot be seen). Reasoning
    tokens a model keeps to itself (counted in OpenAI's output tokens) never reach the stream, and waits on tools
    the service runs itself are not spent decoding. Unknown too where the stream hid reasoning (omitted, redacted)
    that the output count holds without saying how much of it: a spread over all of it would be far too short."""
    if not op.request.stream or op.output_tokens is None or (op.reasoning_hidden and op.reasoning_tokens is None):
        return None
    tokens, chunks, first_ns, waited_ns = op.output_tokens, op.content_chunks, op.first_content_ns, 0
    gaps, skipped = op.gaps_ns, 0  # gaps before the window
    if op.reasoning_tokens and not op.reasoning_streamed:
        tokens -= op.reasoning_tokens
        if op.summary_chunks and gaps is not None:  # timed from the answer's first chunk
            skipped = op.summary_chunks
            chunks -= skipped
            first_ns += sum(gaps[:skipped])
    if op.tool_waits and gaps is not None:  # the service running a tool of its own decodes nothing
        waited_ns = sum(gaps[index] for index in op.tool_waits if skipped <= index < len(gaps))
    if tokens < 2 or chunks < 2:
        return None
    return (op.last_content_ns - first_ns - waited_ns) / _NS / (tokens - 1)


def _content_attributes(op: Operation) -> dict[str, str]:
    """Content as the conventions' JSON strings (see _content), for the span, and read back for the event. Each
    attribute on its own: one that cannot be written costs itself only."""
    attributes: dict[str, str] = {}
    request, output = op.request, op.output

    def put(key: str, build: Callable[[], str | None]) -> None:
        value = ct.safely(build)
        if value is not None:
            attributes[key] = value

    if request.system_instructions:
        put(sc.SYSTEM_INSTRUCTIONS, lambda: ct.to_json(request.system_instructions))
    if request.input_messages:
        put(sc.INPUT_MESSAGES, lambda: ct.to_json(request.input_messages))
    if output is not None:
        def output_messages() -> str | None:
            messages = output.messages(op.finish_reasons, op.error_type is not None)
            return ct.to_json(messages) if messages else None

        put(sc.OUTPUT_MESSAGES, output_messages)
    return attributes
