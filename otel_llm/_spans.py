"""Span attributes set at the finish without the SDK cleaning values we built clean.

``Span.set_attributes()`` runs every value through the SDK's generic cleaning (a recursive type walk, a copy of the
mapping, a locked insert each): about a quarter of all our own work on a non-streamed call. Our finish attributes
are plain already: str, bool, int, float, or a tuple of str. For the OpenTelemetry SDK's own spans with no
attribute value length limit and room under the attribute count limit, ``set_attributes`` writes them into the
span's attribute store under the span's and the store's locks, as the SDK would: an attribute set again moves to
the end. Anything else (another SDK's span, a length limit to apply, a full store, an ended span, a value that is
not plain, internals that are not the ones checked here) takes the public API. tests/test_spans.py checks both
paths give identical spans.

A span's first attributes go through that cleaning too, at its start, where they are given for the sampler's sake.
``QuietStart`` tells when nothing at the start looks at them: the SDK's own samplers (which decide on the trace id
and the parent alone) and span processors (whose ``on_start`` does nothing). The span then starts without them and
they are written right after, directly, before anything else can see the span (so without its locks: no other
thread holds it yet). (A processor another thread adds while a span starts may see that one start without them; the
SDK promises such a processor no start at all.)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

_log = logging.getLogger("otel_llm")

try:
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import Span as SdkSpan
    from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor
    from opentelemetry.sdk.trace import Tracer as SdkTracer
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, ParentBasedTraceIdRatio, StaticSampler, TraceIdRatioBased

    _direct = True
    # exactly these classes: a subclass may look at more
    _BLIND_SAMPLERS: frozenset[type] = frozenset((StaticSampler, TraceIdRatioBased))
    _PARENT_SAMPLERS: frozenset[type] = frozenset((ParentBased, ParentBasedTraceIdRatio))
    _QUIET_PROCESSORS: frozenset[type] = frozenset((BatchSpanProcessor, SimpleSpanProcessor))
except ImportError:  # another SDK: the public API only
    _direct = False

_PLAIN = frozenset((str, bool, int, float))


def set_attributes(span: Any, attributes: Mapping[str, Any], *, quiet_start: bool = False) -> None:
    """``span.set_attributes(attributes)``. ``quiet_start``: the span has just started quietly (see ``QuietStart``),
    and nobody else holds it yet."""
    if _direct and isinstance(span, SdkSpan) and _plain(attributes):
        try:
            if _write(span, attributes, quiet_start):
                return
        except Exception:
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


class QuietStart:
    """Whether the spans a tracer starts may start without attributes, nothing at their start looking at them (see
    the module's docstring). Asked at every start: span processors can be added to a provider at any time."""

    __slots__ = ("_processor", "_quiet", "_seen")

    def __init__(self, tracer: Any) -> None:
        processor = getattr(tracer, "span_processor", None)
        blind = _direct and type(tracer) is SdkTracer and _blind(getattr(tracer, "sampler", None))
        self._processor = processor if blind and type(processor) is SynchronousMultiSpanProcessor else None
        self._seen: object = None
        self._quiet = False

    def __call__(self) -> bool:
        if self._processor is None:
            return False
        processors = getattr(self._processor, "_span_processors", None)
        if processors is not self._seen:  # the SDK adds one by making a new tuple
            self._quiet = isinstance(processors, tuple) and all(type(p) in _QUIET_PROCESSORS for p in processors)
            self._seen = processors
        return self._quiet


_PARENT_DELEGATES = ("_root", "_remote_parent_sampled", "_remote_parent_not_sampled", "_local_parent_sampled",
                     "_local_parent_not_sampled")


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
