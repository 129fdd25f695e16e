"""Our spans are exactly the spans the public API gives: attributes written directly, spans started quietly, and spans
made after their calls under a batch processor; each falls back to the public API where it must."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
import wire
from conftest import Captured, Instrument, attributes, openai_server, sync_client
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    ParentBasedTraceIdRatio,
    Sampler,
    SamplingResult,
    StaticSampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind

import otel_llm
from otel_llm import _semconv as sc
from otel_llm import _spans, _telemetry
from otel_llm._spans import set_attributes

START = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "server.port": 443}
FINISH = {
    "gen_ai.response.id": "chatcmpl-1",
    "gen_ai.response.finish_reasons": ("stop", "length"),
    "gen_ai.usage.output_tokens": 12,
    "gen_ai.response.time_to_first_chunk": 0.25,
    "otel_llm.usage.injected": True,
    "gen_ai.request.model": "m2",  # set again: moves to the end, as with the public API
}


def spans(limits: SpanLimits | None = None) -> tuple[Any, Any]:
    tracer = TracerProvider(span_limits=limits or SpanLimits()).get_tracer("t")
    return (tracer.start_span("direct", attributes=START), tracer.start_span("public", attributes=START))


def seen(span: ReadableSpan) -> tuple[list[tuple[str, Any]], int]:
    assert span.attributes is not None
    return list(span.attributes.items()), span.dropped_attributes


def test_direct_attributes_match_the_public_api(monkeypatch: pytest.MonkeyPatch) -> None:
    direct, public = spans()
    calls = []
    monkeypatch.setattr(direct, "set_attributes", lambda attributes: calls.append(attributes))
    set_attributes(direct, FINISH)
    public.set_attributes(FINISH)
    assert calls == []  # the direct path was taken
    direct.end()
    public.end()
    assert seen(direct) == seen(public)
    assert seen(direct)[0][-1] == ("gen_ai.request.model", "m2")


@pytest.mark.parametrize("limits", [
    SpanLimits(max_span_attribute_length=3),
    SpanLimits(max_span_attributes=5),
], ids=["value length limit", "attribute count limit"])
def test_limits_take_the_public_api(limits: SpanLimits) -> None:
    direct, public = spans(limits)
    set_attributes(direct, FINISH)
    public.set_attributes(FINISH)
    direct.end()
    public.end()
    assert seen(direct) == seen(public)
    assert seen(direct) != (list({**START, **FINISH}.items()), 0)  # the limit did apply


@pytest.mark.parametrize("value", [["a", "b"], ("a", 1), None, {"k": "v"}, b"raw"],
                         ids=["list", "mixed tuple", "None", "mapping", "bytes"])
def test_values_that_are_not_plain_take_the_public_api(value: object) -> None:
    direct, public = spans()
    set_attributes(direct, {"x": value})
    public.set_attributes({"x": value})
    direct.end()
    public.end()
    assert seen(direct) == seen(public)


@pytest.mark.parametrize("key", ["", 1], ids=["empty", "not a str"])
def test_keys_that_are_not_plain_take_the_public_api(key: Any) -> None:
    direct, public = spans()
    set_attributes(direct, {key: "v", "y": 1})
    public.set_attributes({key: "v", "y": 1})
    direct.end()
    public.end()
    assert seen(direct) == seen(public)
    assert key not in dict(seen(direct)[0])  # the SDK drops it, or writes it as a str


def test_an_ended_span_is_left_alone_with_the_sdks_warning(caplog: pytest.LogCaptureFixture) -> None:
    direct, _ = spans()
    direct.end()
    with caplog.at_level(logging.WARNING):
        set_attributes(direct, FINISH)
    assert "Setting attribute on ended span" in caplog.text
    assert seen(direct) == (list(START.items()), 0)


class _OtherSpan(trace.NonRecordingSpan):
    """A span of another SDK: only its own set_attributes knows what to do."""

    def __init__(self) -> None:
        super().__init__(trace.INVALID_SPAN_CONTEXT)
        self.given: list[Any] = []

    def set_attributes(self, attributes: Any) -> None:
        self.given.append(dict(attributes))


def test_spans_of_another_kind_get_the_public_api() -> None:
    span = _OtherSpan()
    set_attributes(span, FINISH)
    assert span.given == [FINISH]


def test_internals_that_are_not_as_expected_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    direct, public = spans()
    monkeypatch.setattr(_spans, "_direct", True)

    def broken(span: Any, attributes: Any) -> bool:
        raise AttributeError("_dict")

    monkeypatch.setattr(_spans, "_write", broken)
    set_attributes(direct, FINISH)
    public.set_attributes(FINISH)
    assert _spans._direct is False  # off for good, and nothing was lost
    direct.end()
    public.end()
    assert seen(direct) == seen(public)


# --- a span's first attributes: at its start only where something there looks at them --------------------------

IDENTITY = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m",
            "server.address": "api.openai.com", "server.port": 443}


def _call(instrument: Instrument, sampler: Any = None) -> Captured:
    otel = instrument(sampler)
    client, _ = sync_client(openai_server(tokens=["a", "b"], usage=wire.Usage(input=3, output=2)))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    return otel


def _call_with_a_hook(limits: SpanLimits | None = None, processor: type = SimpleSpanProcessor) -> tuple[
        ReadableSpan, list[Any]]:
    """A call whose HTTP client runs an application's request hook while our span is current: it reads the model
    off the span, names the real upstream behind a gateway, and tags a tenant."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits or SpanLimits())
    provider.add_span_processor(processor(exporter))
    otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
    seen: list[Any] = []

    def hook(request: Any) -> None:
        span = trace.get_current_span()
        seen.append(dict(span.attributes).get("gen_ai.request.model"))  # type: ignore[attr-defined]
        span.set_attribute("server.address", "upstream.internal")
        span.set_attribute("app.tenant", "acme")

    try:
        client, _ = sync_client(openai_server(tokens=["a"], usage=wire.Usage(input=3, output=1)))
        client._client.event_hooks = {"request": [hook]}
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        otel_llm.uninstrument()  # writes what waits (under a batch span processor), then the provider is its own
    provider.force_flush()
    (span,) = exporter.get_finished_spans()
    return span, seen


@pytest.mark.parametrize("processor", [SimpleSpanProcessor, BatchSpanProcessor],
                         ids=["quiet start (simple processor)", "made at the finish (batch processor)"])
def test_a_quiet_or_later_start_gives_the_span_a_loud_one_gives(monkeypatch: pytest.MonkeyPatch,
                                                                  processor: type) -> None:
    """Under the SDK's own sampler and processors the span starts without its five attributes and has them right
    after, or (batch processor) is made when written: what the application does with the current span during the
    call, and a count limit, come out the same as had it started with them."""
    quiet, seen_quiet = _call_with_a_hook(processor=processor)
    quiet_limited, _ = _call_with_a_hook(SpanLimits(max_span_attributes=len(quiet.attributes or {}) - 1), processor)
    monkeypatch.setattr(_spans.SpanStart, "__call__", lambda self: _spans.LOUD)
    loud, seen_loud = _call_with_a_hook(processor=processor)
    loud_limited, _ = _call_with_a_hook(SpanLimits(max_span_attributes=len(loud.attributes or {}) - 1), processor)
    assert seen_quiet == seen_loud == ["m"]
    assert quiet.attributes is not None and loud.attributes is not None
    assert list(quiet.attributes) == list(loud.attributes)  # the same names, in the same order
    assert list(quiet.attributes)[:6] == ["gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
                                          "server.port", "server.address", "app.tenant"]  # set again: moved last
    assert quiet.attributes["server.address"] == loud.attributes["server.address"] == "upstream.internal"
    assert quiet_limited.attributes is not None and loud_limited.attributes is not None
    assert list(quiet_limited.attributes) == list(loud_limited.attributes)
    assert "gen_ai.operation.name" not in quiet_limited.attributes  # the oldest went, as the SDK drops


class _Looking(Sampler):
    """A sampler of the application's own, which may decide by the attributes a span starts with."""

    def __init__(self) -> None:
        self.given: list[dict[str, Any]] = []

    def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None, trace_state: Any = None) -> SamplingResult:
        self.given.append(dict(attributes or {}))
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "looking"


def test_a_sampler_of_the_applications_own_is_given_the_attributes_at_the_start(instrument: Instrument) -> None:
    sampler = _Looking()
    _call(instrument, ParentBased(sampler))
    assert sampler.given == [IDENTITY]


def test_a_span_processor_added_later_sees_them_at_the_start(instrument: Instrument) -> None:
    otel = _call(instrument)
    started: list[dict[str, Any]] = []

    class Watching(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            started.append(dict(span.attributes))

    otel.tracer_provider.add_span_processor(Watching())
    client, _ = sync_client(openai_server(tokens=["a"], usage=wire.Usage(input=3, output=1)))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert started == [IDENTITY]
    assert all(dict(span.attributes or {}).items() >= IDENTITY.items() for span in otel.spans())


@pytest.mark.parametrize("tracer", [
    TracerProvider(sampler=TraceIdRatioBased(0.5)).get_tracer("t"),
    TracerProvider(sampler=ParentBasedTraceIdRatio(0.5)).get_tracer("t"),
], ids=["ratio", "parent-based ratio"])
def test_the_sdks_samplers_decide_without_them(tracer: Any) -> None:
    assert _spans.SpanStart(tracer)() == _spans.QUIET


@pytest.mark.parametrize("tracer", [
    TracerProvider(sampler=ParentBased(ALWAYS_ON, remote_parent_sampled=_Looking())).get_tracer("t"),
    trace.NoOpTracer(),
    trace.ProxyTracer("t"),
], ids=["own sampler under a parent-based one", "not the SDK's tracer", "proxy tracer"])
def test_anything_else_starts_with_them(tracer: Any) -> None:
    assert _spans.SpanStart(tracer)() == _spans.LOUD


# --- spans made when written: under the SDK's batch span processor ------------------------------------------------

# what differs from one run of the same calls to the next
TIMED = {"gen_ai.response.time_to_first_chunk", "otel_llm.response.max_chunk_gap", "otel_llm.response.time_to_headers",
         "otel_llm.response.time_per_output_token"}


def _calls() -> None:
    """A non-streamed call, a stream read to its end, a stream the caller closed early and a call refused (429)."""
    client, _ = sync_client([
        wire.Reply.json(wire.chat_completion_body("hi", usage=wire.Usage(input=3, output=1))),
        wire.Reply.stream(wire.chat_stream(["a", "b", "c"], usage=wire.Usage(input=3, output=3))),
        wire.Reply.stream(wire.chat_stream(["a", "b", "c"], usage=wire.Usage(input=3, output=3))),
        wire.Reply.rate_limited(),
    ])
    messages = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    list(client.chat.completions.create(model="m", messages=messages, stream=True))  # type: ignore[arg-type]
    with client.chat.completions.create(model="m", messages=messages, stream=True) as stream:  # type: ignore[arg-type]
        next(stream)
        next(stream)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]


def _one_call(hook: Callable[[Any], None] | None = None) -> None:
    """One non-streamed call through the real client; ``hook`` runs as its HTTP request goes out, our span current."""
    client, _ = sync_client(openai_server(tokens=["a"], usage=wire.Usage(input=3, output=1)))
    if hook is not None:
        client._client.event_hooks = {"request": [hook]}
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def _written(span: ReadableSpan) -> tuple[Any, ...]:
    """A span as written, less what moves from run to run (ids, times)."""
    events = [(event.name, {key: value for key, value in (event.attributes or {}).items()
                            if key != "exception.stacktrace"}) for event in span.events]
    context = span.get_span_context()
    return (type(span), span.name, span.kind, span.status.status_code, span.status.description,
            span.instrumentation_scope, span.resource.attributes,
            [(key, value) for key, value in (span.attributes or {}).items() if key not in TIMED], events,
            span.links, span.dropped_attributes, span.dropped_events, span.dropped_links,
            context.trace_flags, context.trace_state, span.parent is None)


def _batched(**processor_options: Any) -> tuple[
        TracerProvider, BatchSpanProcessor, InMemorySpanExporter, InMemoryMetricReader]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = BatchSpanProcessor(exporter, **processor_options)
    provider.add_span_processor(processor)
    reader = InMemoryMetricReader()
    otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider(metric_readers=[reader]))
    return provider, processor, exporter, reader


def test_under_a_batch_processor_the_spans_are_made_after_the_call_and_are_those_made_at_its_start(
        instrument: Instrument) -> None:
    """Nothing of a span is made on the caller's thread: the batch processor has none of them until the provider is
    flushed, which writes what waits first. Then they are the spans a start at the call would have given, with
    the call's own start and end times, and each exception event as the SDK records it."""
    made_at_the_start = instrument()
    _calls()
    otel_llm.uninstrument()
    started = time.time_ns()
    provider, processor, exporter, _ = _batched()
    handed: list[ReadableSpan] = []
    on_end = processor.on_end
    processor.on_end = lambda span: handed.append(span) or on_end(span)  # type: ignore[method-assign]
    try:
        _calls()
        ended = time.time_ns()
        assert handed == []
        provider.force_flush()
        spans = exporter.get_finished_spans()
    finally:
        otel_llm.uninstrument()
    assert [_written(span) for span in spans] == [_written(span) for span in made_at_the_start.spans()]
    assert [attributes(span).get(sc.ERROR_TYPE) for span in spans] == [None, None, "cancelled", "RateLimitError"]
    assert all(started < span.start_time < span.end_time < ended for span in spans)  # type: ignore[operator]
    (event,) = spans[3].events
    assert event.attributes is not None and "openai.RateLimitError" in str(event.attributes["exception.stacktrace"])
    assert started < event.timestamp < ended


def test_the_writer_hands_the_batch_processor_what_a_span_would_without_making_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where its processors are all batch ones, an SDK span's locks, start and end copies are skipped: the writer
    builds the ``ReadableSpan`` the span's end would give, which the test above finds equal."""
    made: list[Any] = []
    make = sdk_trace._Span.__init__
    monkeypatch.setattr(sdk_trace._Span, "__init__", lambda span, *a, **k: made.append(span) or make(span, *a, **k))
    provider, _, exporter, _ = _batched()
    try:
        _calls()
        provider.force_flush()
    finally:
        otel_llm.uninstrument()
    assert len(exporter.get_finished_spans()) == 4
    assert made == []


@pytest.mark.parametrize("processor", [SimpleSpanProcessor, BatchSpanProcessor],
                         ids=["made at the start", "written without an SDK span"])
@pytest.mark.parametrize("when", ["as it waits to be written", "once written"])
def test_the_span_held_after_the_call_is_an_ended_one(caplog: pytest.LogCaptureFixture, processor: type,
                                                        when: str) -> None:
    """An application that kept the current span (from an HTTP hook) holds an ended span once the call returns,
    whether or not it has been written yet: it reads what is written, and what it does with it afterwards is
    refused with the SDK's warning. A stray end() changes nothing of what was written."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(processor(exporter))
    otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
    kept: list[Any] = []
    try:
        _one_call(lambda request: kept.append(trace.get_current_span()))
        returned = time.time_ns()
        if when == "once written":
            provider.force_flush()
        (span,) = kept
        assert not span.is_recording()
        with caplog.at_level(logging.WARNING):
            span.set_attribute("app.late", 1)
            span.add_event("app.late")
            span.end()
            read = (span.is_recording(), span.start_time, span.end_time, dict(span.attributes), span.status)
        provider.force_flush()
    finally:
        otel_llm.uninstrument()
    assert [record.getMessage() for record in caplog.records] == [
        "Setting attribute on ended span.", "Tried calling _add_event on an ended span.",
        "Calling end() on an ended span."]
    (written,) = exporter.get_finished_spans()
    assert read == (False, written.start_time, written.end_time, dict(written.attributes or {}), written.status)
    assert written.end_time is not None and written.end_time < returned
    assert written.events == () and "app.late" not in (written.attributes or {})
    assert attributes(written)[sc.RESPONSE_ID] and attributes(written)[sc.USAGE_OUTPUT_TOKENS] == 1


def test_the_span_current_during_the_call_is_the_one_written() -> None:
    """Its context is decided as the call starts would (parent, ids, sampled), for what runs during the call: an
    HTTP hook, a propagated header, another instrumentation's child span."""
    provider, _, exporter, _ = _batched()
    seen: list[Any] = []

    def hook(request: Any) -> None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        seen.append((trace.get_current_span().get_span_context(), carrier["traceparent"]))

    try:
        client, _ = sync_client(openai_server(tokens=["a"], usage=wire.Usage(input=3, output=1)))
        client._client.event_hooks = {"request": [hook]}
        with provider.get_tracer("app").start_as_current_span("handler") as parent:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        provider.force_flush()
    finally:
        otel_llm.uninstrument()
    ours = next(span for span in exporter.get_finished_spans() if span.name == "chat m")
    ((context, traceparent),) = seen
    assert ours.context == context and ours.context is not None
    assert ours.parent == parent.get_span_context()
    assert context.trace_flags.sampled
    assert traceparent == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


@pytest.mark.parametrize("sampler", [TraceIdRatioBased(0.5), ParentBased(TraceIdRatioBased(0.5))],
                         ids=["ratio", "parent-based ratio"])
def test_the_sampler_decides_what_it_would_have_at_the_start(sampler: Any) -> None:
    """The same random ids (the SDK's generator, seeded alike in both runs) give the same decisions."""
    kept: dict[type, list[int]] = {}
    current: list[type] = []
    for processor in (SimpleSpanProcessor, BatchSpanProcessor):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(processor(exporter))
        otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
        random.seed(2)
        try:
            client, _ = sync_client(openai_server(tokens=["a"], usage=wire.Usage(input=3, output=1)))
            client._client.event_hooks = {"request": [lambda request: current.append(type(trace.get_current_span()))]}
            for _ in range(16):
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        finally:
            otel_llm.uninstrument()
        provider.force_flush()
        kept[processor] = [span.context.trace_id for span in exporter.get_finished_spans()]  # type: ignore[union-attr]
    assert 0 < len(kept[BatchSpanProcessor]) < 16
    assert kept[BatchSpanProcessor] == kept[SimpleSpanProcessor]
    assert set(current[16:]) == {_spans.PendingSpan}  # the batch run's spans were made after their calls


class _Counting(RandomIdGenerator):
    """Ids in the order they are asked for, as some tests' generators give them; or AWS X-Ray's, whose trace id
    holds the time it was made: when a generator of the application's own is asked matters."""

    def __init__(self) -> None:
        self._next = iter(range(1, 1000))

    def generate_trace_id(self) -> int:
        return next(self._next)

    def generate_span_id(self) -> int:
        return next(self._next)


def test_ids_of_a_generator_of_the_applications_own_are_made_at_the_start() -> None:
    made: dict[type, list[tuple[str, int, int]]] = {}
    for processor in (SimpleSpanProcessor, BatchSpanProcessor):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(id_generator=_Counting())
        provider.add_span_processor(processor(exporter))
        otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
        try:
            _one_call()
            with provider.get_tracer("app").start_as_current_span("next"):
                pass
        finally:
            otel_llm.uninstrument()
        provider.force_flush()
        made[processor] = sorted((span.name, span.context.trace_id, span.context.span_id)  # type: ignore[union-attr]
                                 for span in exporter.get_finished_spans())
    assert made[BatchSpanProcessor] == made[SimpleSpanProcessor] == [("chat m", 1, 2), ("next", 3, 4)]


def test_a_span_sampled_out_is_not_written_and_propagates_as_not_sampled() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
    seen: list[str] = []

    def hook(request: Any) -> None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        seen.append(carrier["traceparent"])

    try:
        _one_call(hook)
    finally:
        otel_llm.uninstrument()
    provider.force_flush()
    assert exporter.get_finished_spans() == ()
    assert int(seen[0][-2:], 16) & trace.TraceFlags.SAMPLED == 0


_PARENTS = {  # the span contexts a call may run under, by what the SDK's parent-based sampler tells apart
    "no parent": None,
    **{f"{where} parent{'' if sampled else ' not'} sampled": trace.SpanContext(
        0x5CE1, 0xB0D1 + 2 * (where == "remote") + sampled, is_remote=where == "remote",
        trace_flags=trace.TraceFlags(sampled), trace_state=trace.TraceState([("vendor", f"{where}-{sampled}")]))
       for where in ("remote", "local") for sampled in (1, 0)},
}


def _under_parent(name: str, parent: trace.SpanContext | None, sent: tuple[str, str | None],
                  written: dict[int | None, ReadableSpan]) -> tuple[Any, ...]:
    """What the call under that parent propagated, and of its span if written: flags, state, whether it kept the
    parent's trace."""
    span = written.get(parent.span_id if parent else None)
    if span is None:
        return (name, *sent)
    context = span.get_span_context()
    return (name, *sent, context.trace_flags, context.trace_state,
            context.trace_id == (parent.trace_id if parent else None))


@pytest.mark.parametrize("sampler, written_under", [
    (ALWAYS_ON, list(_PARENTS)),
    (ALWAYS_OFF, []),
    (ParentBased(ALWAYS_ON), ["no parent", "remote parent sampled", "local parent sampled"]),
    (ParentBased(ALWAYS_OFF), ["remote parent sampled", "local parent sampled"]),
    (ParentBased(ALWAYS_ON, remote_parent_sampled=ALWAYS_OFF, local_parent_not_sampled=ALWAYS_ON),
     ["no parent", "local parent sampled", "local parent not sampled"]),
], ids=["always on", "always off", "parent-based on", "parent-based off", "parent-based, delegates of its own"])
def test_the_sdks_static_samplers_decide_under_every_parent_what_they_would_have_at_the_start(
        sampler: Any, written_under: list[str]) -> None:
    """Under a batch processor the SDK's static samplers are not asked (their decision rests on the parent alone):
    what is written, and what the call propagates, are what the sampler gives a span made at the start."""
    seen: dict[type, list[tuple[Any, ...]]] = {}
    for processor in (SimpleSpanProcessor, BatchSpanProcessor):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(processor(exporter))
        otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
        propagated: list[tuple[str, str | None]] = []

        def hook(request: Any, propagated: list[tuple[str, str | None]] = propagated) -> None:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            propagated.append((carrier["traceparent"][-2:], carrier.get("tracestate")))

        try:
            for parent in _PARENTS.values():
                current = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
                token = otel_context.attach(current) if current else None
                try:
                    _one_call(hook)
                finally:
                    if token is not None:
                        otel_context.detach(token)
        finally:
            otel_llm.uninstrument()
        provider.force_flush()
        written = {span.parent.span_id if span.parent else None: span for span in exporter.get_finished_spans()}
        seen[processor] = [_under_parent(name, parent, sent, written)
                           for (name, parent), sent in zip(_PARENTS.items(), propagated, strict=True)]
    assert seen[BatchSpanProcessor] == seen[SimpleSpanProcessor]
    assert [name for name, *written in seen[BatchSpanProcessor] if len(written) > 2] == written_under


@pytest.mark.parametrize("hand_over", ["force_flush", "shutdown"])
def test_the_batch_processor_flushed_or_shut_down_itself_writes_what_waits_first(hand_over: str) -> None:
    """An application may flush or shut down the processor it made rather than its provider: the spans that wait
    for it are written first all the same. Uninstrumented, the processor is the SDK's own again."""
    provider, processor, exporter, _ = _batched()
    try:
        _one_call()
        getattr(processor, hand_over)()
        assert len(exporter.get_finished_spans()) == 1
    finally:
        otel_llm.uninstrument()
    assert "force_flush" not in vars(processor) and "shutdown" not in vars(processor)
    provider.shutdown()


def test_an_exemplar_links_to_the_span_written() -> None:
    provider, _, exporter, reader = _batched()
    try:
        _one_call()
        data = reader.get_metrics_data()  # a collection writes what waits
        provider.force_flush()
    finally:
        otel_llm.uninstrument()
    (span,) = exporter.get_finished_spans()
    assert data is not None and span.context is not None
    (point,) = [metric.data.data_points[0] for resource in data.resource_metrics for scope in resource.scope_metrics
                for metric in scope.metrics if metric.name == sc.STABLE_NAMES.duration.name]
    (exemplar,) = point.exemplars
    assert (exemplar.trace_id, exemplar.span_id) == (span.context.trace_id, span.context.span_id)


def test_the_writer_thread_writes_a_full_batch_and_what_waited_long_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """With nobody flushing: a batch of WRITE_BATCH operations is written at once, fewer within LATER_WAIT_S."""
    monkeypatch.setattr(_telemetry, "WRITE_BATCH", 3)
    _, _, exporter, _ = _batched(schedule_delay_millis=10)
    try:
        def exported(count: int) -> bool:
            deadline = time.monotonic() + 5
            while len(exporter.get_finished_spans()) < count and time.monotonic() < deadline:
                time.sleep(0.01)
            return len(exporter.get_finished_spans()) == count

        _one_call()
        _one_call()
        time.sleep(0.2)
        assert exporter.get_finished_spans() == ()  # two of three, and no time limit (the suite's LATER_WAIT_S)
        _one_call()
        assert exported(3)
        _telemetry.LATER_WAIT_S = 0.05
        _telemetry._later_wake.set()  # the writer thread takes the new limit
        _one_call()
        assert exported(4)
    finally:
        _telemetry.LATER_WAIT_S = None
        otel_llm.uninstrument()


def test_uninstrument_and_a_provider_shutdown_write_what_waits() -> None:
    provider, processor, exporter, _ = _batched()
    _one_call()
    assert len(provider._active_span_processor._span_processors) == 2  # ours first, then the application's
    otel_llm.uninstrument()
    assert provider._active_span_processor._span_processors == (processor,)  # as the application made it
    processor.force_flush()
    assert len(exporter.get_finished_spans()) == 1

    provider, processor, exporter, _ = _batched()
    try:
        _one_call()
        provider.shutdown()
        assert len(exporter.get_finished_spans()) == 1
    finally:
        otel_llm.uninstrument()


def test_a_simple_processor_beside_the_batch_one_sees_each_span_as_it_ends() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
    try:
        _one_call()
        assert len(exporter.get_finished_spans()) == 1
    finally:
        otel_llm.uninstrument()


def _sdk_span_counts(reader: InMemoryMetricReader) -> list[tuple[str, Any, Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return sorted((metric.name, sorted(point.attributes.items()), point.value)
                  for resource in data.resource_metrics for scope in resource.scope_metrics
                  for metric in scope.metrics if metric.name.startswith("otel.sdk.span")
                  for point in metric.data.data_points)


@pytest.mark.parametrize("sampler", [ALWAYS_ON, StaticSampler(Decision.RECORD_ONLY), ParentBased(ALWAYS_OFF)],
                         ids=["sampled", "recorded only", "sampled out"])
def test_the_sdks_own_span_metrics_count_as_at_the_start(monkeypatch: pytest.MonkeyPatch, sampler: Any) -> None:
    """With OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED the SDK counts spans started and live, recording with the
    context current at the start (its exemplar filter looks at the current span): a span is live while its call
    runs. A span context asked for while the call runs (a propagated header), and a call that fails, are the
    application's as before."""
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    counts: dict[type, list[Any]] = {}
    for processor in (SimpleSpanProcessor, BatchSpanProcessor):
        sdk_reader = InMemoryMetricReader()
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=sampler, meter_provider=MeterProvider(metric_readers=[sdk_reader]))
        provider.add_span_processor(processor(exporter))
        otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
        during: list[Any] = []

        def hook(request: Any, during: list[Any] = during, sdk_reader: InMemoryMetricReader = sdk_reader) -> None:
            during.append(_sdk_span_counts(sdk_reader))
            propagate.inject({})

        try:
            client, _ = sync_client([
                wire.Reply.json(wire.chat_completion_body("hi", usage=wire.Usage(input=3, output=1))),
                wire.Reply.rate_limited()])
            client._client.event_hooks = {"request": [hook]}
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        finally:
            otel_llm.uninstrument()
        provider.force_flush()
        counts[processor] = [during, _sdk_span_counts(sdk_reader),
                             [_written(span) for span in exporter.get_finished_spans()]]
    assert counts[BatchSpanProcessor] == counts[SimpleSpanProcessor]
    assert counts[BatchSpanProcessor][0][0]  # counted during the call


def test_spans_touched_while_the_writer_thread_writes_them_are_written_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer thread and an application thread touching a span that waits race to write it: one does."""
    monkeypatch.setattr(_telemetry, "LATER_WAIT_S", 0.001)
    provider, _, exporter, _ = _batched()
    kept: list[Any] = []
    done = threading.Event()

    def touch() -> None:
        while not done.is_set() or kept:
            if kept:
                kept.pop().set_attribute("app.late", 1)

    toucher = threading.Thread(target=touch)
    toucher.start()
    try:
        client, _ = sync_client(openai_server(tokens=["a"], usage=wire.Usage(input=3, output=1)))
        current: list[Any] = []
        client._client.event_hooks = {"request": [lambda request: current.append(trace.get_current_span())]}
        for _ in range(200):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            kept.append(current.pop())  # touched once the call has returned: an ended span
    finally:
        done.set()
        toucher.join()
        otel_llm.uninstrument()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    assert len(spans) == len({span.context.span_id for span in spans}) == 200  # type: ignore[union-attr]
    assert not any("app.late" in (span.attributes or {}) for span in spans)


class _Recording(SpanProcessor):
    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: list[str] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started.append(span.name)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span.name)


def test_a_processor_added_later_sees_the_ends_of_spans_that_end_after_it_came_only() -> None:
    """As with the SDK's spans: a processor added while a stream is read sees its end, not its start; a call that
    finished before (its span may still wait to be written) it never sees."""
    seen: dict[type, tuple[Any, ...]] = {}
    for processor in (SimpleSpanProcessor, BatchSpanProcessor):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(processor(exporter))
        otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
        added = _Recording()
        try:
            client, _ = sync_client([
                wire.Reply.json(wire.chat_completion_body("hi", usage=wire.Usage(input=3, output=1))),
                wire.Reply.stream(wire.chat_stream(["a", "b"], usage=wire.Usage(input=3, output=2)))])
            client.chat.completions.create(model="before", messages=[{"role": "user", "content": "hi"}])
            stream = client.chat.completions.create(model="streamed", messages=[{"role": "user", "content": "hi"}],
                                                    stream=True)
            next(stream)
            provider.add_span_processor(added)
            list(stream)
        finally:
            otel_llm.uninstrument()
        provider.force_flush()
        seen[processor] = (added.started, added.ended, sorted(span.name for span in exporter.get_finished_spans()))
    assert seen[BatchSpanProcessor] == seen[SimpleSpanProcessor] == (
        [], ["chat streamed"], ["chat before", "chat streamed"])


def test_the_application_touching_the_span_during_the_call_has_it_made_there() -> None:
    """What the SDK copies when it is given (a list attribute, an event's attributes) is not changed by what the
    application does with its own objects afterwards, and the span's fields read as the SDK's."""
    written: dict[type, Any] = {}
    for processor in (SimpleSpanProcessor, BatchSpanProcessor):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(processor(exporter))
        otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider())
        read: list[Any] = []

        def hook(request: Any, read: list[Any] = read) -> None:
            span = trace.get_current_span()
            values, event = ["a"], {"k": "v"}
            span.set_attribute("app.list", values)
            span.add_event("app.event", event)
            values.append("changed")
            event["k"] = "changed"
            read.append((span.kind, span.parent, span.end_time, span.start_time is not None,  # type: ignore[attr-defined]
                         dict(span.attributes)["app.list"]))  # type: ignore[attr-defined]

        try:
            _one_call(hook)
        finally:
            otel_llm.uninstrument()
        provider.force_flush()
        (span,) = exporter.get_finished_spans()
        written[processor] = (read, _written(span))
    assert written[BatchSpanProcessor] == written[SimpleSpanProcessor]
    assert written[BatchSpanProcessor][0] == [(SpanKind.CLIENT, None, None, True, ("a",))]


def test_what_waits_for_a_writer_thread_that_falls_behind_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads keeping the interpreter busy may leave the writer thread too little of it: past MAX_WAITING, a
    finishing call writes a batch itself, and nothing is lost."""
    monkeypatch.setattr(_telemetry, "WRITE_BATCH", 2)
    monkeypatch.setattr(_telemetry, "MAX_WAITING", 5)
    monkeypatch.setattr(_telemetry._later_wake, "set", lambda: None)  # a writer thread that never gets its turn
    provider, _, exporter, _ = _batched()
    waiting = []
    try:
        for _ in range(12):
            _one_call()
            waiting.append(len(_telemetry._DEFERRED))
        provider.force_flush()
    finally:
        otel_llm.uninstrument()
    assert waiting == [1, 2, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4]  # at MAX_WAITING, a batch of WRITE_BATCH goes
    assert len(exporter.get_finished_spans()) == 12
