"""How our spans start, and their attributes set at the finish without the SDK cleaning values we built clean.

``Span.set_attributes()`` runs every value through the SDK's generic cleaning (a recursive type walk, a copy of the
mapping, a locked insert each): about a quarter of all our own work on a non-streamed call. Our finish attributes
are plain already: str, bool, int, float, or a tuple of str. For the OpenTelemetry SDK's own spans with no
attribute value length limit and room under the attribute count limit, ``set_attributes`` writes them into the
span's attribute store under the span's and the store's locks, as the SDK would: an attribute set again moves to
the end. Anything else (another SDK's span, a length limit to apply, a full store, an ended span, a value that is
not plain, internals that are not the ones checked here) takes the public API. tests/test_spans.py checks both
paths give identical spans.

``SpanStart`` tells how a tracer's spans may start:
- LOUD, through the public API with their first attributes, given for the sampler's sake and cleaned too;
- QUIET, where nothing at the start looks at them: the SDK's own samplers (which decide on the trace id and the
  parent alone) and span processors (whose ``on_start`` does nothing). The span starts without them and they are
  written right after, directly, before anything else can see the span (so without its locks: no other thread holds
  it yet). (A processor another thread adds while a span starts may see that one start without them; the SDK
  promises such a processor no start at all.)
- LATER, where those processors are all the SDK's ``BatchSpanProcessor`` (which exports seconds later anyway), its
  ids are the SDK's random ones and the SDK counts no spans of its own (so when ids are made and spans counted
  cannot be seen): no SDK span is made at the start. A ``PendingSpan`` stands in while the call runs, and when the
  operation is written, in batches off the caller's thread (see ``_telemetry``), the processors of its start are
  handed the ``ReadableSpan`` the span's end would have given them, with the call's start and end times, and no SDK
  span is made at all: made and ended between milliseconds of client work, one span costs 3-6x what it costs next
  to others, and most of what it costs is the span itself. (The rare call whose span the application touches while
  it runs has it made there and then, and so does a span whose provider's processors changed during its call.) A
  ``WaitingSpans`` processor, first in the provider's list, has the waiting operations written when the provider is
  flushed or shut down, before the batch processor exports.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_llm._safety import reraise_if_signalled

_log = logging.getLogger("otel_llm")

try:
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor
    from opentelemetry.sdk.trace import Span as SdkSpan
    from opentelemetry.sdk.trace import Tracer as SdkTracer
    from opentelemetry.sdk.trace import _Span as _MadeSpan
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import (
        Decision,
        ParentBased,
        ParentBasedTraceIdRatio,
        SamplingResult,
        StaticSampler,
        TraceIdRatioBased,
    )
    from opentelemetry.sdk.util import BoundedList

    _direct = True
    # exactly these classes: a subclass may look at more
    _BLIND_SAMPLERS: frozenset[type] = frozenset((StaticSampler, TraceIdRatioBased))
    _PARENT_SAMPLERS: frozenset[type] = frozenset((ParentBased, ParentBasedTraceIdRatio))
    _QUIET_PROCESSORS: frozenset[type] = frozenset((BatchSpanProcessor, SimpleSpanProcessor))
    # what PendingSpan does as the SDK's Tracer.start_span does, with the internals it reads
    _later = {"attributes", "events", "links", "status", "start_time", "end_time", "instrumentation_scope"} <= set(
        inspect.signature(ReadableSpan.__init__).parameters)
    # the events or links of a written span that has none: a ReadableSpan only reads them (and hands out copies),
    # and an ended SDK span refuses additions, so one empty list serves every span
    _NONE: BoundedList[Any] = BoundedList(None)
    _TRACER_INTERNALS = ("sampler", "resource", "span_processor", "id_generator", "instrumentation_info",
                         "_span_limits", "_instrumentation_scope", "_tracer_metrics", "_is_enabled")
except ImportError:  # another SDK: the public API only
    _direct = _later = False
try:  # what the SDK counts its own spans with when it counts none (OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED unset)
    from opentelemetry.sdk.trace._tracer_metrics import NoOpTracerMetrics as _NoOpTracerMetrics
except ImportError:
    _NoOpTracerMetrics = None  # type: ignore[assignment,misc]

_PLAIN = frozenset((str, bool, int, float))


def set_attributes(span: Any, attributes: Mapping[str, Any], *, quiet_start: bool = False) -> None:
    """``span.set_attributes(attributes)``. ``quiet_start``: the span has just started quietly (see ``QuietStart``),
    and nobody else holds it yet."""
    if _direct and isinstance(span, SdkSpan) and _plain(attributes):
        try:
            if _write(span, attributes, quiet_start):
                return
        except Exception:
            reraise_if_signalled()
            _off()
    span.set_attributes(attributes)


def _write(span: Any, attributes: Mapping[str, Any], quiet_start: bool) -> bool:
    store = span._attributes
    if type(store) is not BoundedAttributes or store.max_value_len is not None:
        return False
    if quiet_start:  # no other thread can reach the span yet: its locks guard nothing (and cost more than the write)
        return _put(store, attributes)
    with span._lock:
        if span._end_time is not None:  # ended: the public API warns
            return False
        with store._lock:
            return _put(store, attributes)


def _put(store: BoundedAttributes, attributes: Mapping[str, Any]) -> bool:
    values = store._dict
    if store._immutable or (store.maxlen is not None and len(values) + len(attributes) > store.maxlen):
        return False
    if not values.keys().isdisjoint(attributes.keys()):  # rare: the check costs less than an empty set
        for key in values.keys() & attributes.keys():
            del values[key]
    values.update(attributes)
    return True


def _plain(attributes: Mapping[str, Any]) -> bool:
    """Keys non-empty str; values str, bool, int, float or a tuple of str (exact types). A plain loop: the set and
    map calls it replaced cost three times as much on a finish's dozen attributes."""
    for key, value in attributes.items():
        if type(key) is not str or not key:
            return False
        kind = type(value)
        if kind not in _PLAIN:
            if kind is not tuple:
                return False
            for item in value:
                if type(item) is not str:
                    return False
    return True


# how a span starts (SpanStart): through the public API with its attributes; without them, written right after;
# as a PendingSpan, made at the finish
LOUD, QUIET, LATER = 0, 1, 2


class SpanStart:
    """How the spans a tracer starts may start (see the module's docstring): LOUD, QUIET or LATER. Asked at every
    start: span processors can be added to a provider at any time. ``write_waiting(timeout_s)`` writes the operations
    whose spans wait (LATER only where there is one)."""

    __slots__ = ("_mode", "_processor", "_seen", "_write_waiting")

    def __init__(self, tracer: Any, write_waiting: Callable[[float | None], None] | None = None) -> None:
        processor = getattr(tracer, "span_processor", None)
        blind = _direct and type(tracer) is SdkTracer and _blind(getattr(tracer, "sampler", None))
        self._processor = processor if blind and type(processor) is SynchronousMultiSpanProcessor else None
        # Later only where when a span's ids are made and when it is counted cannot be seen: the SDK's random ids
        # (a custom generator may take the time, as AWS X-Ray's does, or count) and no span metrics of the SDK's own
        # (OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED counts live spans while they run)
        later = _later and all(hasattr(tracer, name) for name in _TRACER_INTERNALS) \
            and type(tracer.id_generator) is RandomIdGenerator and type(tracer._tracer_metrics) is _NoOpTracerMetrics
        self._write_waiting = write_waiting if later else None
        self._seen: object = None
        self._mode = LOUD

    def __call__(self) -> int:
        if self._processor is None:
            return LOUD
        processors = getattr(self._processor, "_span_processors", None)
        if processors is not self._seen:  # the SDK adds one by making a new tuple
            self._mode = self._choose(processors)
            self._seen = getattr(self._processor, "_span_processors", None)  # with WaitingSpans, if it was added
        return self._mode

    def _choose(self, processors: Any) -> int:
        if not isinstance(processors, tuple) or not all(type(p) in _QUIET_PROCESSORS or type(p) is WaitingSpans
                                                        for p in processors):
            return LOUD
        kinds = {type(p) for p in processors}
        if self._write_waiting is None or BatchSpanProcessor not in kinds or SimpleSpanProcessor in kinds:
            return QUIET
        if WaitingSpans not in kinds and not WaitingSpans.install(self._processor, self._write_waiting):
            return QUIET
        WaitingSpans.watch(processors, self._write_waiting)
        return LATER


class WaitingSpans(SpanProcessor if _direct else object):  # type: ignore[misc]
    """First of a provider's span processors where spans wait to be made: the provider's ``force_flush()`` and
    ``shutdown()`` write the operations that wait before the processors after it flush or shut down. The batch
    processors' own ``force_flush()`` and ``shutdown()`` do too (``watch``): an application may flush the processor
    it made rather than its provider."""

    def __init__(self, write_waiting: Callable[[float | None], None]) -> None:
        self._write_waiting = write_waiting

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._write_waiting(timeout_millis / 1e3)
        return True

    def shutdown(self) -> None:
        self._write_waiting(None)

    @staticmethod
    def install(processor: Any, write_waiting: Callable[[float | None], None]) -> bool:
        """Put one first in the SDK's multi-processor; False where its internals are not the ones known here."""
        lock = getattr(processor, "_lock", None)
        if lock is None:
            return False
        with lock:
            processors = processor._span_processors
            if not any(type(p) is WaitingSpans for p in processors):
                processor._span_processors = (WaitingSpans(write_waiting), *processors)
        _INSTALLED.append(processor)
        return True

    @staticmethod
    def watch(processors: tuple[Any, ...], write_waiting: Callable[[float | None], None]) -> None:
        """Have each batch processor's own ``force_flush()`` and ``shutdown()`` write what waits first (methods of
        the instance, over its class's, until ``uninstall``)."""
        for processor in processors:
            if type(processor) is BatchSpanProcessor and processor not in _WATCHED:
                processor.force_flush = functools.partial(  # type: ignore[method-assign]
                    _flush_after_writing, processor, write_waiting)
                processor.shutdown = functools.partial(  # type: ignore[method-assign]
                    _shut_down_after_writing, processor, write_waiting)
                _WATCHED.add(processor)

    @staticmethod
    def uninstall() -> None:
        """uninstrument(): the providers go back to their own processors, and the batch processors to their class's
        methods (what waits is written first)."""
        while _INSTALLED:
            processor = _INSTALLED.pop()
            with processor._lock:
                processor._span_processors = tuple(p for p in processor._span_processors
                                                   if type(p) is not WaitingSpans)
        for watched in list(_WATCHED):
            for name in ("force_flush", "shutdown"):
                vars(watched).pop(name, None)
        _WATCHED.clear()


def _flush_after_writing(processor: Any, write_waiting: Callable[[float | None], None],
                         timeout_millis: int = 30000) -> bool:
    write_waiting(timeout_millis / 1e3)
    return bool(BatchSpanProcessor.force_flush(processor, timeout_millis))


def _shut_down_after_writing(processor: Any, write_waiting: Callable[[float | None], None]) -> None:
    write_waiting(None)
    BatchSpanProcessor.shutdown(processor)  # type: ignore[no-untyped-call]


_INSTALLED: list[Any] = []  # the multi-processors a WaitingSpans was put into
_WATCHED: weakref.WeakSet[Any] = weakref.WeakSet()  # the batch processors watched


class PendingSpan(trace.Span):
    """An operation's span while its SDK span waits to be made, current while the call runs. What the tracer
    decides at a span's start (its ids, the sampler's decision) is decided the first time it is asked for (the span
    context: a child span, a propagated header, an exemplar) or when the span is made: the samplers and the id
    generator that let a span wait decide on its parent and random ids alone, so the answer is the one its start
    would have given. Anything else done with it while the call runs (attributes, events, status, ending it, reading
    its fields) makes the SDK span there and then, as the tracer would have made it at the start, and that span takes
    it: the rare call whose span is touched while it runs pays what every call paid before. Once the operation has
    finished, the span is an ended one: touched while it waits to be written, it is written there and then, and
    what is done with it is done to the span as it ended (warnings and all, as the SDK's)."""

    __slots__ = ("_decided", "_made", "_name", "_parent", "_processors", "_start_attributes", "_start_time",
                 "_tracer", "_waited", "_waiting", "_write_one", "_writer", "_written")

    def __init__(self, tracer: Any, name: str, parent: Context, start_time: int,
                 start_attributes: Callable[[], Mapping[str, Any]], processors: tuple[Any, ...],
                 write_one: Callable[[object], None]) -> None:
        self._tracer = tracer
        self._name = name
        self._parent = parent  # the context current at the start
        self._start_time = start_time
        self._start_attributes = start_attributes  # what it starts with, made when wanted
        # the provider's span processors at the start: the batch ones its end is handed to (see waits())
        self._processors = processors
        # (span context, parent span context, sampling result): the first one made
        self._decided: list[tuple[SpanContext, SpanContext | None, Any]] = []
        self._made: Any = None
        self._written: ReadableSpan | None = None  # what end_written() handed the processors
        # None until the finish; then what waits to be written (see waits()), _WRITING, _WRITTEN
        self._waiting: object = None
        self._waited = False  # it waited to be written: its end was at the finish, with the processors of its start
        self._write_one = write_one  # writes what waited, claimed (see claim())
        self._writer = 0  # the thread that claimed it

    def _decision(self) -> tuple[SpanContext, SpanContext | None, Any]:
        """What ``Tracer.start_span`` decides. Two threads asking at once each decide, and both take the first."""
        if not self._decided:
            tracer, ids = self._tracer, self._tracer.id_generator
            parent: SpanContext | None = trace.get_current_span(self._parent).get_span_context()
            if parent is not None and parent.is_valid:
                trace_id, random_id = parent.trace_id, parent.trace_flags.random_trace_id
            else:
                parent = None
                trace_id, random_id = ids.generate_trace_id(), ids.is_trace_id_random()
            result = _static_decision(tracer.sampler, parent)
            if result is None:
                result = tracer.sampler.should_sample(self._parent, trace_id, self._name, SpanKind.CLIENT, None, ())
            flags = TraceFlags.SAMPLED if result.decision.is_sampled() else TraceFlags.DEFAULT
            if random_id:
                flags |= TraceFlags.RANDOM_TRACE_ID
            context = SpanContext(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=TraceFlags(flags),
                                  trace_state=result.trace_state)
            self._decided.append((context, parent, result))
        return self._decided[0]

    def waits(self, waiting: object) -> bool:
        """The operation finished: its span may wait to be written (as ``waiting``, what ``write_one`` takes) if it
        was not made and the provider's processors are still those of its start (batch ones, which export later
        anyway). Otherwise it is written at once: a processor added during the call sees its end (not its start),
        as the SDK's would, and a processor added after the finish does not see it."""
        if self._made is not None or getattr(self._tracer.span_processor, "_span_processors", None) \
                is not self._processors:
            return False
        self._waiting, self._waited = waiting, True
        return True

    def claim(self) -> bool:
        """For a thread about to write the operation: False where another thread is writing it or has, so it is
        written once; else True, and a thread that touches the span meanwhile waits for this write."""
        return self._claim() is not _WRITING

    def _claim(self) -> object:
        """What waited to be written (None if nothing did), now being written by this thread; or _WRITING where
        another thread is writing it or has."""
        with _MAKING:
            waiting = self._waiting
            if waiting is _WRITING or waiting is _WRITTEN:
                return _WRITING
            self._waiting, self._writer = _WRITING, threading.get_ident()
            return waiting

    def written(self) -> None:
        self._waiting = _WRITTEN

    def make(self) -> Any:
        """The SDK span, made once: started at its start time with its first attributes, as the tracer would have
        started it then (a span that records nothing where the sampler records none). Once ``end_written()`` has
        written it, the SDK span as it ended, which the processors are not told of again. Its start is not told to
        any processor: those of its start are batch ones, which do nothing there, and one added since never hears
        of the start of a span that started before it (as with the SDK)."""
        with _MAKING:
            if self._made is None:
                context, parent, result = self._decision()
                if not result.decision.is_recording():
                    self._made = trace.NonRecordingSpan(context)
                else:
                    tracer = self._tracer
                    span = _MadeSpan(name=self._name, context=context, parent=parent, sampler=tracer.sampler,
                                     resource=tracer.resource, attributes=result.attributes,
                                     span_processor=tracer.span_processor, kind=SpanKind.CLIENT, links=(),
                                     instrumentation_info=tracer.instrumentation_info, limits=tracer._span_limits,
                                     instrumentation_scope=tracer._instrumentation_scope)
                    written = self._written
                    if written is not None:  # as end() left it: what is done with it now warns, as the SDK does
                        span._start_time, span._end_time, span._status = (
                            written.start_time, written.end_time, written.status)
                        span._attributes, span._events = written._attributes, written._events
                    else:
                        span._start_time = self._start_time
                        set_attributes(span, self._start_attributes(), quiet_start=True)
                    self._made = span
            return self._made

    def _touched(self) -> Any:
        """The SDK span, for what the application does with the span: once the operation has finished, the span as
        it ended, written here first if it still waits (or, being written on another thread, once it is)."""
        if self._waiting is not None:  # finished
            waiting = self._claim()
            if waiting is _WRITING:
                if self._writer != threading.get_ident():  # another thread's write, not this one's own
                    deadline = time.monotonic() + _TOUCH_WAIT_S
                    while self._waiting is _WRITING and time.monotonic() < deadline:
                        time.sleep(0.001)
            elif waiting is not None:
                self._write_one(waiting)
        return self.make()

    def end_written(self, attributes: Mapping[str, Any], status: Status | None, exception: Mapping[str, Any] | None,
                    end_time: int) -> bool:
        """End the span with the finish's attributes, status and exception event, where nothing made it yet and
        the processors of its start are batch ones, still there (or, for a span that waited, there at its finish):
        the ``ReadableSpan`` the SDK span would hand them at its end, built and handed to them without the span (its
        locks, its start, the copies its end makes: most of what a span costs). False, having done nothing, where
        that cannot be: the caller then makes the span."""
        tracer = self._tracer
        processors = self._processors
        with _MAKING:
            if (self._made is not None or not _direct or not _BATCHING.issuperset(map(type, processors))
                    or (not self._waited
                        and getattr(tracer.span_processor, "_span_processors", None) is not processors)):
                return False
            context, parent, result = self._decision()
            if not result.decision.is_recording():
                return False
            limits = tracer._span_limits
            store = BoundedAttributes(limits.max_span_attributes, result.attributes, immutable=False,
                                      max_value_len=limits.max_span_attribute_length)
            start_attributes = self._start_attributes()
            if not (store.max_value_len is None and _plain(start_attributes) and _put(store, start_attributes)
                    and _plain(attributes) and _put(store, attributes)):
                return False
            store._immutable = True
            events: BoundedList[Event] = _NONE
            if exception is not None:
                events = BoundedList(limits.max_events)
                events.append(Event("exception", BoundedAttributes(
                    limits.max_event_attributes, exception, max_value_len=limits.max_attribute_length,
                    immutable=True), end_time))
            span = ReadableSpan(name=self._name, context=context, parent=parent, resource=tracer.resource,
                                attributes=store, events=events, links=_NONE,
                                kind=SpanKind.CLIENT, instrumentation_info=tracer.instrumentation_info,
                                start_time=self._start_time, end_time=end_time,
                                instrumentation_scope=tracer._instrumentation_scope,
                                **({} if status is None else {"status": status}))
            self._written = span
        for processor in processors:  # what the multi-processor's on_end does, with those of the start
            processor.on_end(span)
        return True

    def get_span_context(self) -> SpanContext:
        return self._decision()[0]

    def recording(self) -> bool:
        """Whether the span records, for the writer: sampled, and not written yet."""
        if self._made is not None:
            return bool(self._made.is_recording())
        return self._written is None and bool(self._decision()[2].decision.is_recording())

    def is_recording(self) -> bool:
        return self._waiting is None and self.recording()  # a finished (ended) span records nothing

    def end(self, end_time: int | None = None) -> None:
        self._touched().end(end_time)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self._touched().set_attributes(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self._touched().set_attribute(key, value)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        self._touched().add_event(name, attributes, timestamp)

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        self._touched().add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self._touched().update_name(name)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self._touched().set_status(status, description)

    def record_exception(self, exception: BaseException, attributes: Any = None, timestamp: int | None = None,
                         escaped: bool = False) -> None:
        self._touched().record_exception(exception, attributes, timestamp, escaped)

    def __getattr__(self, name: str) -> Any:
        """The SDK span's other fields (``attributes``, ``start_time``, ``parent``, ``to_json()``, ...)."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._touched(), name)


_WRITING, _WRITTEN = object(), object()  # PendingSpan._waiting while what waited is being written, and after
# how long a thread that touches a span being written on another thread waits for it at most (the write takes
# microseconds; a writer that fails to write it leaves the span as it was at the start, made there)
_TOUCH_WAIT_S = 1.0


# the processors end_written() hands spans to: their on_start and _on_ending do nothing
_BATCHING: frozenset[type] = frozenset((BatchSpanProcessor, WaitingSpans)) if _direct else frozenset()
# a static sampler's result for a span without a parent, one per decision: the same every time
_ROOT_RESULTS: dict[Any, Any] = {decision: SamplingResult(decision) for decision in Decision} if _direct else {}
_MAKING = threading.RLock()  # one SDK span per PendingSpan, made on the caller's thread or the writer's


def _renew_making() -> None:
    """In a forked child: the writer thread may have held it at the fork, and it would stay held for good."""
    global _MAKING
    _MAKING = threading.RLock()


os.register_at_fork(after_in_child=_renew_making)


def pending_span(tracer: Any, name: str, start_time: int, start_attributes: Callable[[], Mapping[str, Any]],
                 write_one: Callable[[object], None]) -> trace.Span:
    """What ``tracer.start_span(name, kind=CLIENT, attributes=start_attributes(), start_time=start_time)`` gives,
    its SDK span made later: a PendingSpan, or where the tracer is disabled the current span's context in a span
    that records nothing. ``write_one(waiting)`` writes what ``PendingSpan.waits()`` was given, once claimed."""
    current = otel_context.get_current()
    if not tracer._is_enabled():
        return trace.NonRecordingSpan(trace.get_current_span(current).get_span_context())
    return PendingSpan(tracer, name, current, start_time, start_attributes, tracer.span_processor._span_processors,
                       write_one)


_PARENT_DELEGATES = ("_root", "_remote_parent_sampled", "_remote_parent_not_sampled", "_local_parent_sampled",
                     "_local_parent_not_sampled")


def _static_decision(sampler: Any, parent: SpanContext | None) -> Any:
    """What the SDK's static samplers decide (ALWAYS_ON, ALWAYS_OFF, and the default ParentBased over them), as they
    would, without asking them: they look at nothing but the parent span's context (None: no valid parent). None for
    any other sampler, which is asked."""
    if type(sampler) is ParentBased:
        if parent is None:
            sampler = sampler._root
        else:
            sampled = parent.trace_flags.sampled
            if parent.is_remote:
                sampler = sampler._remote_parent_sampled if sampled else sampler._remote_parent_not_sampled
            else:
                sampler = sampler._local_parent_sampled if sampled else sampler._local_parent_not_sampled
    if type(sampler) is not StaticSampler:
        return None
    if parent is None:
        return _ROOT_RESULTS.get(sampler._decision)
    return SamplingResult(sampler._decision, None, parent.trace_state)


def _blind(sampler: Any) -> bool:
    """A sampler that decides without a span's attributes."""
    if type(sampler) in _BLIND_SAMPLERS:
        return True
    return type(sampler) in _PARENT_SAMPLERS and all(
        type(getattr(sampler, name, None)) in _BLIND_SAMPLERS for name in _PARENT_DELEGATES)


def _off() -> None:
    global _direct
    _log.debug("otel_llm: SDK span internals not as expected; span attributes use the public API", exc_info=True)
    _direct = False
