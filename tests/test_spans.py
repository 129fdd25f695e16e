"""Span attributes written directly give exactly the span the public API gives, and fall back to it where they must."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import wire
from conftest import Captured, Instrument, openai_server, sync_client
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    ParentBasedTraceIdRatio,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)

import otel_llm
from otel_llm import _spans
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


def _call_with_a_hook(limits: SpanLimits | None = None) -> tuple[ReadableSpan, list[Any]]:
    """A call whose HTTP client runs an application's request hook while our span is current: it reads the model
    off the span, names the real upstream behind a gateway, and tags a tenant."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits or SpanLimits())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
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
        otel_llm.uninstrument()
    (span,) = exporter.get_finished_spans()
    return span, seen


def test_a_quiet_start_gives_the_span_a_loud_one_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the SDK's own sampler and processors the span starts without its five attributes and has them right
    after: what the application does with the current span during the call, and a count limit, come out the same
    as had it started with them."""
    quiet, seen_quiet = _call_with_a_hook()
    quiet_limited, _ = _call_with_a_hook(SpanLimits(max_span_attributes=len(quiet.attributes or {}) - 1))
    monkeypatch.setattr(_spans.QuietStart, "__call__", lambda self: False)
    loud, seen_loud = _call_with_a_hook()
    loud_limited, _ = _call_with_a_hook(SpanLimits(max_span_attributes=len(loud.attributes or {}) - 1))
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
    assert _spans.QuietStart(tracer)()


@pytest.mark.parametrize("tracer", [
    TracerProvider(sampler=ParentBased(ALWAYS_ON, remote_parent_sampled=_Looking())).get_tracer("t"),
    trace.NoOpTracer(),
    trace.ProxyTracer("t"),
], ids=["own sampler under a parent-based one", "not the SDK's tracer", "proxy tracer"])
def test_anything_else_starts_with_them(tracer: Any) -> None:
    assert not _spans.QuietStart(tracer)()
