"""Span attributes written directly give exactly the span the public API gives, and fall back to it where they must."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider

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
