"""The promises to the host application: its exceptions pass through unchanged, our failures never reach it,
nothing it sends or receives is altered or leaked, and instrument/uninstrument are exact inverses."""

from __future__ import annotations

import dataclasses
import gc
import importlib
import importlib.util
import json
import logging
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import httpx2
import openai
import pydantic
import pytest
import wire
import wrapt
from conftest import (
    API_KEY,
    BASE_URL,
    Captured,
    Instrument,
    Received,
    assert_read_alike_and_recorded,
    attributes,
    openai_server,
    received,
    sync_client,
)
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

import otel_llm
from otel_llm import _instrumentor, _operation, _safety, _stream, _telemetry
from otel_llm import _semconv as sc
from otel_llm._patching import Client
from otel_llm.providers import openai as openai_adapter

TOKENS = ["p", "q"]
USAGE = wire.Usage(input=3, output=2)
MESSAGES = [{"role": "user", "content": "hi"}]


def test_rate_limit_error_passes_through_with_retries_counted(otel: Captured) -> None:
    replies = [wire.Reply.rate_limited(retry_after=0.01), wire.Reply.rate_limited(retry_after=0.01),
               wire.Reply.rate_limited(retry_after=0.01)]
    client, recorder = sync_client(replies, max_retries=2)
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert raised.value.status_code == 429
    assert len(recorder.requests) == 3
    span = otel.span()  # one span for the operation, retries inside it
    attrs = attributes(span)
    assert span.status.status_code is StatusCode.ERROR
    assert attrs[sc.ERROR_TYPE] == "RateLimitError"
    assert attrs[sc.RETRIES] == 2
    assert attrs[sc.RETRY_AFTER] == 0.01
    assert attrs[sc.RATE_LIMIT_REMAINING_PREFIX + sc.RATE_LIMIT_REQUESTS] == 0
    duration = otel.point(sc.STABLE_NAMES.duration.name)
    assert duration.attributes[sc.ERROR_TYPE] == "RateLimitError"
    assert otel.point(sc.STABLE_NAMES.rate_limit_remaining.name,
                      otel_llm__rate_limit__resource="requests").value == 0


def test_retry_then_success_is_one_ok_span(otel: Captured) -> None:
    client, recorder = sync_client([wire.Reply.rate_limited(retry_after=0.01),
                                    wire.Reply.json(wire.chat_completion_body("pq", usage=USAGE))], max_retries=2)
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(recorder.requests) == 2
    attrs = attributes(otel.span())
    assert attrs[sc.RETRIES] == 1
    assert sc.ERROR_TYPE not in attrs


@pytest.mark.parametrize(("headers", "retry_after"), [
    ({"retry-after": "2", "retry-after-ms": "1500"}, 1.5),  # the finer one wins
    ({"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, None),  # a date is not a duration: left out
], ids=["ms wins", "http date"])
def test_rate_limit_headers_whatever_their_case(otel: Captured, headers: dict[str, str],
                                                retry_after: float | None) -> None:
    limits = {name.title(): value for name, value in wire.openai_ratelimit_headers(500, 7, 9000, 8000).items()}
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("pq"), status=429,
                                             headers={**limits, **headers})])
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="m", messages=MESSAGES)
    attrs = attributes(otel.span())
    assert attrs.get(sc.RETRY_AFTER) == retry_after
    assert (attrs[sc.RATE_LIMIT_REMAINING_PREFIX + sc.RATE_LIMIT_REQUESTS],
            attrs[sc.RATE_LIMIT_LIMIT_PREFIX + sc.RATE_LIMIT_TOKENS]) == (7, 9000)


def test_headers_of_a_class_we_do_not_know_are_read_from_their_raw_pairs() -> None:
    """httpx and httpx2 keep each name lower-cased beside it, which we read; any other class (a release that
    changed that) is read from its ``raw`` name and value pairs, in whatever case, to the same result."""
    known = wire.openai_ratelimit_headers(500, 7, 9000, 8000) | {"retry-after-ms": "250"}
    raw = types.SimpleNamespace(raw=[(name.title().encode(), value.encode()) for name, value in known.items()])
    read = []
    for headers in (httpx2.Headers(known), raw):
        op = _operation.Operation(request=None, start_ns=0, start_epoch_ns=0,  # type: ignore[arg-type]
                                  span=None, context=None)  # type: ignore[arg-type]
        openai_adapter._HEADERS.read(op, headers)
        read.append((op.rate_limits, op.retry_after))
    assert read[0] == read[1] == ({"requests": (7, 500), "tokens": (8000, 9000)}, 0.25)


def test_timeout_is_recorded_by_class_name(otel: Captured) -> None:
    with wire.LoopbackServer([wire.Reply.json(wire.chat_completion_body("pq"), headers_delay=1.0)]) as server:
        client = openai.OpenAI(api_key="k", base_url=server.base_url, max_retries=0, timeout=0.1)
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="m", messages=MESSAGES)
    assert attributes(otel.span())[sc.ERROR_TYPE] == "APITimeoutError"


def test_bad_request_error_is_the_sdks_own_object(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.json(wire.error_body("no such model"), status=404)])
    with pytest.raises(openai.NotFoundError, match="no such model") as raised:
        client.chat.completions.create(model="nope", messages=MESSAGES)
    # the traceback ends in the SDK, not in a wrapper of ours that raised something new
    assert raised.value.__cause__ is None
    assert attributes(otel.span())[sc.ERROR_TYPE] == "NotFoundError"


def test_our_failure_on_an_odd_chunk_is_swallowed_and_logged_once(
        otel: Captured, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_safety, "strict", False)
    monkeypatch.setattr(_safety, "_reported", set())
    events = wire.chat_stream(TOKENS)
    # a chunk whose choice's delta is a string: the SDK passes it on unvalidated, our chunk reader cannot read it
    odd = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": 0, "delta": "not an object", "finish_reason": None}]}
    events.insert(1, wire.sse(odd))
    events.insert(2, wire.sse(odd))
    client, _ = sync_client([wire.Reply.stream(events)])
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert len(chunks) == len(events) - 1  # every chunk reached the caller, [DONE] excepted
    assert [r.message for r in caplog.records].count(
        "otel_llm: internal failure in stream chunk; telemetry for this call is incomplete") == 1
    assert otel.span().status.status_code is StatusCode.UNSET


class Timeout(Exception):
    """What an application's signal-based timeout raises."""


@pytest.mark.parametrize("stream", [False, True], ids=["reading the headers", "reading a chunk"])
def test_an_exception_a_signal_handler_raises_in_our_code_is_the_callers(
        otel: Captured, monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    """Python runs a signal handler between any two bytecodes, ours included: what it raises there (a timeout's
    exception) is the caller's, and reaches it as it would without us, never taken for a failure of ours. The
    operation records it, or, raised by a stream's chunk, ends as the caller leaves the stream (here its with)."""
    monkeypatch.setattr(_safety, "strict", False)

    def time_out(number: int, frame: Any) -> None:
        raise Timeout("too slow")

    def signalled(original: Any) -> Any:
        def reading(*args: Any) -> Any:
            signal.raise_signal(signal.SIGUSR1)  # the handler runs at once, in this frame
            return original(*args)
        return reading

    if stream:
        monkeypatch.setattr(openai_adapter._CHAT, "observe", signalled(openai_adapter._CHAT.observe))
    else:
        monkeypatch.setattr(openai_adapter._HEADERS, "read", signalled(openai_adapter._HEADERS.read))
    before = signal.signal(signal.SIGUSR1, time_out)
    try:
        client, _ = sync_client([wire.Reply.stream(wire.chat_stream(TOKENS)) if stream
                                 else wire.Reply.json(wire.chat_completion_body("pq"))])
        with pytest.raises(Timeout, match="too slow"):
            if stream:
                with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as chunks:
                    list(chunks)
            else:
                client.chat.completions.create(model="m", messages=MESSAGES)
    finally:
        signal.signal(signal.SIGUSR1, before)
    otel.assert_finished(sc.ERROR_CANCELLED if stream else "Timeout")


def test_a_stream_proxy_an_interrupt_left_half_made_is_dropped_quietly(
        otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt (KeyboardInterrupt, a signal handler's exception) can land as a stream's proxy is being built,
    before it holds its operation: the caller gets the interrupt, and the half-made proxy's finalizer finds nothing to
    finish, neither raising nor reporting a failure of ours."""
    unraisable: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: unraisable.append(report.exc_value))
    holder_init = _stream._Holder.__init__.__code__

    def interrupt(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is holder_init:
            sys.settrace(None)
            raise KeyboardInterrupt
        return None

    client, _ = sync_client([wire.Reply.stream(wire.chat_stream(TOKENS))])
    sys.settrace(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    finally:
        sys.settrace(None)
    gc.collect()
    assert unraisable == []


def _oddly(events: list[bytes], rng: random.Random, spare: int | None) -> list[bytes]:
    """Each JSON event but the one at index ``spare``, with probability 0.4, made odd (see wire.oddly)."""
    return [wire.sse(wire.oddly(json.loads(event.removeprefix(b"data: ")), rng))
            if event.startswith(b"data: {") and index != spare and rng.random() < 0.4 else event
            for index, event in enumerate(events)]


def test_streams_with_odd_values_anywhere_reach_the_caller_unchanged_and_are_recorded(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """200 chat streams (a seeded draw), each with values of another type or missing anywhere in its chunks. What
    the caller gets (every chunk, or the client's own exception) is what it gets without us, less any chunk shaped as
    the usage chunk we asked for when the caller did not (no choices, a usage: hidden whatever the usage holds); every
    call still ends in one span and one duration; and our only failures are chunks we could not read (logged,
    skipped). Found this way: a model name a server sent as a list cost its call every metric point, and a chunk
    whose choices were null or a string was hidden as a usage chunk."""
    rng = random.Random(5)
    cases = []  # (the caller asked for usage, the events a server sends when it is asked)
    for _ in range(200):
        asked = rng.random() < 0.5
        # the usage chunk we ask for comes from a server that was asked: odd only where the caller asked too
        events = wire.chat_stream(TOKENS, usage=USAGE)
        cases.append((asked, _oddly(events, rng, spare=None if asked else len(events) - 2)))

    def read(case: tuple[bool, list[bytes]]) -> Received:
        asked, events = case
        client, _ = sync_client([wire.Reply.stream(events)])
        options: dict[str, Any] = {"stream_options": {"include_usage": True}} if asked else {}
        return received(lambda: client.chat.completions.create(model="m", messages=MESSAGES, stream=True, **options))

    def ours_hidden(event: bytes) -> bool:
        data = json.loads(event.removeprefix(b"data: ")) if event.startswith(b"data: {") else None
        return isinstance(data, dict) and data.get("choices") == [] and data.get("usage") is not None

    def unasked(event: bytes) -> bytes:
        """As OpenAI sends a chunk unasked: no null usage. Counts it holds stay (we cannot tell a server's own from
        those it sent because we asked); so does whatever odd value a usage holds."""
        data = json.loads(event.removeprefix(b"data: ")) if event.startswith(b"data: {") else None
        if not (isinstance(data, dict) and "usage" in data and data["usage"] is None):
            return event
        del data["usage"]
        return wire.sse(data)

    # not asked, the server sends no usage chunk; a chunk the odd values gave that chunk's shape is hidden all the same
    without = [read((True, events) if asked else (False, [unasked(event) for event in events
                                                          if not ours_hidden(event)]))
               for asked, events in cases]
    assert_read_alike_and_recorded(instrument, monkeypatch, caplog, cases, read, without)


@pytest.mark.parametrize("method, where", [("on_start", "span start"), ("on_end", "span")])
def test_a_span_processor_that_raises_costs_the_span_not_the_metrics(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, method: str, where: str) -> None:
    monkeypatch.setattr(_safety, "strict", False)
    monkeypatch.setattr(_safety, "_reported", set())

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a broken span pipeline")

    processor = SpanProcessor()
    setattr(processor, method, broken)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(processor)
    reader = InMemoryMetricReader()
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
        with caplog.at_level(logging.WARNING, logger="otel_llm"):
            for _ in range(3):
                list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        captured = Captured(InMemorySpanExporter(), reader, tracer_provider)
        assert captured.point(sc.STABLE_NAMES.duration.name).count == 3
        assert captured.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 3
        assert [r.message for r in caplog.records] == [
            f"otel_llm: internal failure in {where}; telemetry for this call is incomplete"]
    finally:
        otel_llm.uninstrument()


def test_a_hook_left_in_place_under_another_librarys_wrapper_counts_nothing_twice(instrument: Instrument) -> None:
    """uninstrument() leaves a patch that someone re-wrapped; after instrument() again, the old hook must not
    count the new round's retries too."""
    import openai._base_client as base_client

    instrument()
    wrapt.wrap_function_wrapper(base_client, "SyncAPIClient._sleep_for_retry",
                                lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    try:
        otel_llm.uninstrument()
        captured = instrument()
        client, _ = sync_client([wire.Reply.rate_limited(0.01), wire.Reply.json(wire.chat_completion_body("pq"))],
                                max_retries=1)
        client.chat.completions.create(model="m", messages=MESSAGES)
        assert attributes(captured.span())[sc.RETRIES] == 1
    finally:
        otel_llm.uninstrument()
        wrapper = vars(base_client.SyncAPIClient)["_sleep_for_retry"]
        while isinstance(wrapper, wrapt.FunctionWrapper):  # theirs over ours, over the SDK's
            wrapper = wrapper.__wrapped__
        base_client.SyncAPIClient._sleep_for_retry = wrapper


def test_a_call_wrapper_left_in_place_under_another_librarys_wrapper_records_nothing_twice(
        instrument: Instrument) -> None:
    """uninstrument() leaves a wrapper that someone re-wrapped; after instrument() again, the call passes the new
    round's wrapper and then the old one, and is one operation."""
    cls = openai.resources.chat.completions.completions.Completions
    instrument()
    wrapt.wrap_function_wrapper(cls, "create", lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    try:
        otel_llm.uninstrument()
        captured = instrument()
        client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
        client.chat.completions.create(model="m", messages=MESSAGES)
        captured.assert_finished(None)
    finally:
        otel_llm.uninstrument()
        wrapper = vars(cls)["create"]
        while isinstance(wrapper, wrapt.FunctionWrapper):  # theirs over ours, over the SDK's
            wrapper = wrapper.__wrapped__
        cls.create = wrapper


def test_an_instrumentation_that_wrapped_the_client_first_is_named_once(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Another instrumentation patched openai's create before us (OpenTelemetry's openai-v2, say): both record
    every call, which the application should hear of once, not find out from doubled dashboards."""
    from openai.resources.chat.completions.completions import Completions

    def theirs(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return wrapped(*args, **kwargs)

    monkeypatch.setattr(Completions, "create", wrapt.FunctionWrapper(vars(Completions)["create"], theirs))
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        instrument()
    assert [r.getMessage() for r in caplog.records] == [
        "otel_llm: openai's Completions.create is already wrapped by test_contract; if that is another "
        "instrumentation recording GenAI telemetry, each call is recorded twice: keep one"]


def test_providers_passed_once_instrumented_are_said_to_be_unused(
        instrument: Instrument, caplog: pytest.LogCaptureFixture) -> None:
    captured = instrument()
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        otel_llm.instrument()  # nothing passed: nothing to say
        otel_llm.instrument(tracer_provider=captured.tracer_provider)  # the one in use: nothing to say either
        assert caplog.records == []
        otel_llm.instrument(tracer_provider=TracerProvider())
    assert [r.getMessage() for r in caplog.records] == [
        "otel_llm: already instrumented (by opentelemetry-instrument or an earlier instrument()); the providers "
        "passed now are not used. Call otel_llm.uninstrument() first to change them"]
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("pq"))])
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(captured.spans()) == 1  # still the first providers'


def test_uninstrument_keeps_no_provider_alive() -> None:
    """An application that drops its providers after uninstrument() gets them freed (a fresh process: nothing of
    the suite's holds them)."""
    script = textwrap.dedent("""
        import gc, weakref
        import otel_llm
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        tracer_provider, meter_provider = TracerProvider(shutdown_on_exit=False), MeterProvider(shutdown_on_exit=False)
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        otel_llm.uninstrument()
        refs = weakref.ref(tracer_provider), weakref.ref(meter_provider)
        del tracer_provider, meter_provider
        gc.collect()
        print([ref() is None for ref in refs])
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[True,", "True]"]


class RefusingTracers(TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no tracers here")


class RefusingHistograms(MeterProvider):
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        meter = super().get_meter(*args, **kwargs)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("no histograms here")

        meter.create_histogram = refuse  # type: ignore[method-assign]
        return meter


def test_providers_that_record_nothing_leave_every_request_as_it_is(instrument: Instrument,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The API's no-op providers, passed or set globally: nothing could be recorded, so nothing is patched (our
    usage request would change the streams); instrument() with working ones later instruments."""
    cls = openai.resources.chat.completions.completions.Completions
    original = vars(cls)["create"]
    with caplog.at_level(logging.INFO, logger="otel_llm"):
        otel_llm.instrument(tracer_provider=trace.NoOpTracerProvider(), meter_provider=NoOpMeterProvider())
    try:
        assert vars(cls)["create"] is original
        assert "otel_llm: the tracer and meter providers are the API's no-op ones; not instrumenting" in caplog.messages
        client, recorder = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
        list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        assert "stream_options" not in recorder.requests[0].json
        captured = instrument()
        client.chat.completions.create(model="m", messages=MESSAGES)
        assert len(captured.spans()) == 1
    finally:
        otel_llm.uninstrument()


@pytest.mark.parametrize("providers", [(RefusingTracers, MeterProvider), (TracerProvider, RefusingHistograms)],
                         ids=["tracer provider", "meter"])
def test_providers_that_raise_leave_instrument_a_logged_no_op(
        instrument: Instrument, caplog: pytest.LogCaptureFixture, providers: tuple[Any, Any]) -> None:
    cls = openai.resources.chat.completions.completions.Completions
    original = vars(cls)["create"]
    tracer_provider, meter_provider = providers
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        otel_llm.instrument(tracer_provider=tracer_provider(), meter_provider=meter_provider())
    try:
        assert vars(cls)["create"] is original
        assert "otel_llm: cannot set up its telemetry; not instrumenting" in [r.message for r in caplog.records]
        assert [thread for thread in threading.enumerate() if thread.name == "otel_llm-writer"] == []
        captured = instrument()  # providers that work: not taken for a second call, this one instruments
        client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
        client.chat.completions.create(model="m", messages=MESSAGES)
        assert len(captured.spans()) == 1
    finally:
        otel_llm.uninstrument()


def test_unsampled_tracer_still_records_metrics(instrument: Instrument) -> None:
    captured = instrument(sampler=ALWAYS_OFF)
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert captured.spans() == []
    ttfc = captured.point(sc.STABLE_NAMES.time_to_first_chunk.name)
    assert ttfc.count == 1
    assert ttfc.exemplars == []  # no sampled trace to point at


def test_metric_points_link_to_their_trace(otel: Captured) -> None:
    client, _ = sync_client(openai_server(tokens=["a", "b", "c", "d"], usage=USAGE, delays=[0, 0, 0.001, 0.02, 0.001]))
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    span = otel.span()
    metrics = otel.metrics()  # one collection: the SDK hands out each exemplar once
    names = sc.STABLE_NAMES
    for name in (names.duration.name, names.time_to_first_chunk.name, names.time_per_output_token.name):
        (point,) = metrics[name]
        exemplars = point.exemplars
        assert [e.trace_id for e in exemplars] == [span.context.trace_id]
        assert exemplars[0].span_id == span.context.span_id
    # of a stream's chunk gaps, the longest one links to the trace
    (gaps,) = metrics[names.time_per_output_chunk.name]
    assert [e.value for e in gaps.exemplars] == [attributes(span)[sc.MAX_CHUNK_GAP]]
    # counts are not latencies: no exemplars on them
    counts = (names.prompt_length.name, names.token_usage.name)
    assert all(not point.exemplars for name in counts for point in metrics[name])


def test_span_is_current_only_while_the_sdk_call_runs(otel: Captured) -> None:
    seen_by_transport = []

    def answer(request: wire.RecordedRequest) -> wire.Reply:
        seen_by_transport.append(trace.get_current_span().get_span_context().span_id)
        return wire.Reply.stream(wire.chat_stream(TOKENS))

    client, _ = sync_client(answer)
    tracer = otel.tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("handler") as outer:
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        assert trace.get_current_span() is outer  # not leaked into the caller's code
        list(stream)
    llm = next(s for s in otel.spans() if s.name == "chat m")
    assert seen_by_transport == [llm.context.span_id]  # an HTTP client span would be its child
    assert llm.parent is not None and llm.parent.span_id == outer.get_span_context().span_id


def test_no_content_and_no_secrets_by_default(otel: Captured) -> None:
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "my secret plan"}],
                                        stream=True))
    recorded = json.dumps({**attributes(otel.span())}, default=str)
    recorded += json.dumps([dict(p.attributes) for points in otel.metrics().values() for p in points])
    assert "secret plan" not in recorded and "pq" not in recorded
    assert API_KEY not in recorded and "authorization" not in recorded.lower()


def test_a_key_the_server_quotes_in_its_error_is_not_recorded(otel: Captured) -> None:
    """A gateway that names the key it refused: the caller's exception says so, our exception event does not."""
    client, _ = sync_client([wire.Reply.json(wire.error_body(f"Invalid API key: {API_KEY}"), status=401)])
    with pytest.raises(openai.AuthenticationError, match=API_KEY):
        client.chat.completions.create(model="m", messages=MESSAGES)
    (event,) = otel.span().events
    assert event.attributes is not None and event.attributes["exception.type"] == "openai.AuthenticationError"
    assert event.attributes["exception.message"] == "Error code: 401 - Invalid API key: [REDACTED]"
    assert API_KEY not in otel.span().to_json()


@pytest.mark.parametrize("auth", ["api key", "bearer header"])
def test_the_clients_key_quoted_by_an_error_of_the_callers_own_is_not_recorded(otel: Captured, auth: str) -> None:
    """A request hook of the caller's refuses the request, quoting its headers: the exception reaches the caller as
    raised (openai hands on what is not an HTTP error), with no request to show; our event leaves the key out."""
    http, _ = wire.mock_client(openai_server(tokens=TOKENS, usage=USAGE))

    def refuse(request: httpx2.Request) -> None:
        raise RuntimeError(f"policy refused a request with headers {dict(request.headers)}")

    http.event_hooks["request"] = [refuse]
    client = openai.OpenAI(api_key=API_KEY, base_url=BASE_URL, http_client=http, max_retries=0)
    if auth == "bearer header":  # a gateway's own key beside the client's
        client = client.with_options(default_headers={"Authorization": "Bearer gw-0123456789abcdef"})
    key = API_KEY if auth == "api key" else "gw-0123456789abcdef"
    with pytest.raises(RuntimeError, match=key):
        client.chat.completions.create(model="m", messages=MESSAGES)
    (event,) = otel.span().events
    assert event.attributes is not None and "[REDACTED]" in str(event.attributes["exception.message"])
    assert key not in otel.span().to_json()


class Answer(pydantic.BaseModel):
    diagnosis: str


@pytest.mark.parametrize("capture", [None, "SPAN_ONLY"], ids=["capture off", "content on the span"])
def test_an_answer_the_parser_quotes_in_its_error_is_content(instrument: Instrument, capture: str | None) -> None:
    """pydantic's ValidationError quotes the answer it refused: with content capture off, the exception event says
    where and why it failed, not what the answer said; with content on the span, as pydantic wrote it."""
    captured = instrument(**({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": capture} if capture else {}))
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body('{"diagnosis": "CONDITION-X", "score'))])
    with pytest.raises(pydantic.ValidationError, match="CONDITION-X") as raised:
        client.chat.completions.parse(model="m", messages=MESSAGES, response_format=Answer)
    (event,) = captured.span().events
    assert event.attributes is not None
    if capture:
        assert event.attributes["exception.message"] == str(raised.value)
    else:
        assert "CONDITION-X" not in captured.span().to_json()
        assert event.attributes["exception.message"] == "1 validation error for Answer\n(root)\n  Invalid JSON: " \
            "EOF while parsing a string at line 1 column 35 [type=json_invalid]"
        assert str(event.attributes["exception.stacktrace"]).startswith("Traceback (most recent call last):")


# what the conventions' schemas make of a one-message chat: role and parts in, role, parts and finish reason out
PLAN_IN = [{"role": "user", "parts": [{"type": "text", "content": "my plan"}]}]
PLAN_OUT = [{"role": "assistant", "parts": [{"type": "text", "content": "pq"}], "finish_reason": "stop"}]


def test_content_on_span_when_opted_in(instrument: Instrument) -> None:
    captured = instrument(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY")
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "my plan"}], stream=True))
    attrs = attributes(captured.span())
    assert json.loads(attrs[sc.INPUT_MESSAGES]) == PLAN_IN
    assert json.loads(attrs[sc.OUTPUT_MESSAGES]) == PLAN_OUT
    assert API_KEY not in json.dumps(dict(attrs))


def test_content_as_events_when_opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "EVENT_ONLY")
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(),
                        logger_provider=logger_provider)
    try:
        client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "my plan"}])
    finally:
        otel_llm.uninstrument()
    (span,) = exporter.get_finished_spans()
    assert sc.INPUT_MESSAGES not in attributes(span)  # events only
    (record,) = [r.log_record for r in logs.get_finished_logs()]
    assert record.event_name == sc.EVENT_OPERATION_DETAILS
    assert record.span_id == span.context.span_id
    assert record.attributes is not None
    # structured on events, as the conventions require (the log record keeps lists as tuples)
    assert json.loads(json.dumps(record.attributes[sc.INPUT_MESSAGES])) == PLAN_IN
    assert json.loads(json.dumps(record.attributes[sc.OUTPUT_MESSAGES])) == PLAN_OUT
    assert isinstance(record.attributes[sc.OUTPUT_MESSAGES], tuple)


def test_instrument_twice_is_a_no_op_and_uninstrument_restores_exactly(instrument: Instrument) -> None:
    cls = openai.resources.chat.completions.completions.Completions
    original = vars(cls)["create"]
    captured = instrument()
    patched = vars(cls)["create"]
    assert patched is not original
    otel_llm.instrument()  # a second call changes nothing
    assert vars(cls)["create"] is patched
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(captured.spans()) == 1
    otel_llm.uninstrument()
    assert vars(cls)["create"] is original
    for target in openai_adapter.PROVIDER.targets:
        *path, name = target.attribute.split(".")
        owner = importlib.import_module(target.module)
        for part in path:
            owner = getattr(owner, part)
        assert not isinstance(vars(owner).get(name), wrapt.FunctionWrapper), target
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(captured.spans()) == 1


def test_methods_taken_while_instrumented_are_recorded_by_the_round_that_runs(instrument: Instrument) -> None:
    """A bound method kept by the application, and the SDK's with_raw_response / with_streaming_response accessors
    (which keep the bound method they saw when first used), hold our wrapper: after uninstrument() it does
    nothing, and after instrument() again the new round records each call, once."""
    captured = instrument()
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    completions = client.chat.completions
    create, raw, streaming = completions.create, completions.with_raw_response, completions.with_streaming_response

    def call_each() -> None:
        create(model="m", messages=MESSAGES)
        raw.create(model="m", messages=MESSAGES).parse()
        with streaming.create(model="m", messages=MESSAGES) as response:
            response.parse()

    call_each()
    assert len(captured.spans()) == 3
    otel_llm.uninstrument()
    call_each()
    assert len(captured.spans()) == 3
    again = instrument()
    call_each()
    completions.create(model="m", messages=MESSAGES)
    assert len(captured.spans()) == 3
    assert len(again.spans()) == 4


def test_instrument_again_on_the_same_providers_exports_every_value() -> None:
    """The SDK hands back instruments already made under a name and drops the callbacks of the new ones: what the
    second instrument() records must still reach the reader, rate-limit headroom included."""
    reader = InMemoryMetricReader()
    captured = Captured(InMemorySpanExporter(), reader, TracerProvider())
    meter_provider = MeterProvider(metric_readers=[reader])
    headers = [wire.openai_ratelimit_headers(500, left, 9000, 900) for left in (100, 40)]
    try:
        for left_headers in headers:
            otel_llm.instrument(tracer_provider=captured.tracer_provider, meter_provider=meter_provider)
            client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("pq"), headers=left_headers)] * 3)
            for _ in range(3):
                client.chat.completions.create(model="m", messages=MESSAGES)
            otel_llm.uninstrument()
        assert captured.point(sc.STABLE_NAMES.duration.name).count == 6
        assert captured.point(sc.STABLE_NAMES.rate_limit_remaining.name,
                              otel_llm__rate_limit__resource="requests").value == 40
    finally:
        otel_llm.uninstrument()


def test_a_later_round_on_other_providers_leaves_the_earlier_ones_headroom_alone() -> None:
    """uninstrument(), then instrument() with a new meter provider: its calls' rate-limit headroom goes to it, not
    also to the provider of the round before (whose other metrics never see those calls either)."""
    readers = [InMemoryMetricReader(), InMemoryMetricReader()]
    try:
        for reader, left in zip(readers, (10, 2), strict=True):
            otel_llm.uninstrument()
            otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider(metric_readers=[reader]))
            headers = wire.openai_ratelimit_headers(500, left, 9000, 900)
            client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("pq"), headers=headers)])
            client.chat.completions.create(model="m", messages=MESSAGES)
        first, second = (Captured(InMemorySpanExporter(), reader, TracerProvider()) for reader in readers)
        name = sc.STABLE_NAMES.rate_limit_remaining.name
        assert [point.value for point in second.points(name, otel_llm__rate_limit__resource="requests")] == [2]
        assert [point.value for point in first.points(name, otel_llm__rate_limit__resource="requests")] == []
        assert first.point(sc.STABLE_NAMES.duration.name).count == 1
    finally:
        otel_llm.uninstrument()


PROXY_ROUNDS = {
    # instrument() on the API's proxy provider; the application sets the real one; instrument() again on that
    "proxy, then real": ("""
        instrument(metrics.get_meter_provider())
        metrics.set_meter_provider(real)
        calls(3)
        otel_llm.uninstrument()
        instrument(real)
        calls(5)
    """, ["8", "[495.0]"]),
    # two rounds on the proxy provider; the application sets the real one during the second
    "proxy twice, then real": ("""
        instrument(metrics.get_meter_provider())
        calls(1)
        otel_llm.uninstrument()
        instrument(metrics.get_meter_provider())
        calls(2)
        metrics.set_meter_provider(real)
        calls(3)
    """, ["3", "[497.0]"]),
    # a round on the real provider before it is the global one, then one on the proxy, then the real one is set
    "real, proxy, then real set": ("""
        instrument(real)
        calls(1)
        otel_llm.uninstrument()
        instrument(metrics.get_meter_provider())
        metrics.set_meter_provider(real)
        calls(3)
    """, ["4", "[497.0]"]),
}


@pytest.mark.parametrize("rounds", PROXY_ROUNDS, ids=PROXY_ROUNDS)
def test_values_recorded_after_rounds_on_the_api_proxy_meter_provider_reach_the_reader(rounds: str) -> None:
    """Of the gauges made under one name on one meter the SDK keeps the first (an earlier round's, or those the
    proxy forwarded when the application set its provider) and drops the others: still every value is exported,
    and the rate-limit headroom is the latest."""
    steps, expected = PROXY_ROUNDS[rounds]
    program = textwrap.dedent("""
        import openai, wire
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        import otel_llm

        def calls(count):
            headers = wire.openai_ratelimit_headers(500, 500 - count, 9000, 8000)
            reply = wire.Reply.json(wire.chat_completion_body("pq"), headers=headers)
            http, _ = wire.mock_client([reply] * count)
            client = openai.OpenAI(api_key="k", http_client=http, max_retries=0)
            for _ in range(count):
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])

        tracer_provider = TracerProvider()
        def instrument(meter_provider):
            otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        reader = InMemoryMetricReader()
        real = MeterProvider(metric_readers=[reader])
    """) + textwrap.dedent(steps) + textwrap.dedent("""
        data = reader.get_metrics_data()
        points = {metric.name: list(metric.data.data_points) for resource in data.resource_metrics
                  for scope in resource.scope_metrics for metric in scope.metrics}
        print(sum(point.count for point in points["gen_ai.client.operation.duration"]),
              [point.value for point in points["otel_llm.client.rate_limit.remaining"]
               if point.attributes["otel_llm.rate_limit.resource"] == "requests"])
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == expected


def test_uninstrument_lets_go_of_its_telemetry_with_clients_never_imported() -> None:
    """Import hooks of clients the application never imported stay registered after uninstrument(); they must not
    keep the telemetry (and through it the providers) alive."""
    program = textwrap.dedent("""
        import gc, sys
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        import otel_llm
        from otel_llm._telemetry import Telemetry
        for _ in range(3):
            otel_llm.instrument(tracer_provider=TracerProvider(),
                                meter_provider=MeterProvider(shutdown_on_exit=False))
            otel_llm.uninstrument()
        gc.collect()
        print(sorted(name for name in ("openai", "anthropic", "botocore") if name in sys.modules),
              sum(isinstance(thing, Telemetry) for thing in gc.get_objects()))
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "0"]


def test_clients_are_patched_when_the_application_imports_them() -> None:
    """instrument() imports no client itself: one the application never imports costs it nothing."""
    program = textwrap.dedent("""
        import sys
        import otel_llm
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
        print(sorted(name for name in ("openai", "anthropic", "botocore") if name in sys.modules))
        import openai.resources.chat.completions.completions as chat
        print(type(vars(chat.Completions)["create"]).__name__)
        otel_llm.uninstrument()
        import anthropic.resources.messages.messages as messages
        print(type(vars(messages.Messages)["create"]).__name__)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # nothing imported by instrument(); openai patched on import; anthropic, imported after uninstrument(), not
    assert result.stdout.split() == ["[]", "FunctionWrapper", "function"]


def test_a_client_being_imported_by_another_thread_is_patched_once_that_import_is_done() -> None:
    program = textwrap.dedent("""
        import importlib.machinery, sys, threading, time
        import otel_llm, wrapt
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider

        class SlowLoader:  # widens the window between the import finders and the module entering sys.modules
            def __init__(self, loader): self.loader = loader
            def create_module(self, spec):
                time.sleep(0.5)
                return self.loader.create_module(spec)
            def exec_module(self, module): return self.loader.exec_module(module)

        class SlowFinder:
            def find_spec(self, name, path=None, target=None):
                if name != "openai" or threading.current_thread().name != "importer":
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path, target)
                spec.loader = SlowLoader(spec.loader)
                return spec

        sys.meta_path.insert(0, SlowFinder())
        importer = threading.Thread(target=lambda: __import__("openai"), name="importer")
        importer.start()
        time.sleep(0.1)
        otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
        importer.join()
        from openai.resources.chat.completions.completions import Completions
        print(type(vars(Completions)["create"]).__name__, type(vars(Completions)["create"].__wrapped__).__name__)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["FunctionWrapper", "function"]  # patched, and once


def test_a_client_we_cannot_instrument_is_skipped_with_a_warning(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # json: imported already, and a distribution that is installed, for an adapter module that does not exist
    monkeypatch.setattr(_instrumentor, "ADAPTERS", {"no_such_adapter": Client("json", "wrapt", (0,), (99,))})
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        instrument()  # the hook runs at once for an imported package, and must not raise
    assert "cannot instrument the installed json; skipped" in caplog.text


def test_client_version_outside_the_known_range_is_skipped_before_its_adapter_is_imported(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A much older client lacks types the adapter imports: the range is checked first, so the warning is the
    range's, not an import error's."""
    known = _instrumentor.ADAPTERS["openai"]
    monkeypatch.setattr(_instrumentor, "ADAPTERS", {"no_such_adapter": dataclasses.replace(known,
                                                                                           below_version=(1,))})
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        instrument()
    assert [r.getMessage() for r in caplog.records] == [
        f"otel_llm: openai {openai.__version__} is outside the versions otel_llm supports (>=1.92, <1); "
        "not instrumenting it"]
    assert not isinstance(vars(openai.resources.chat.completions.completions.Completions)["create"],
                          wrapt.FunctionWrapper)


@pytest.mark.timing  # the longest gap, a 20 ms pause, within 10 ms
def test_unsampled_streams_keep_their_span_figures_but_record_no_gaps(instrument: Instrument) -> None:
    captured = instrument(OTEL_LLM_CHUNK_GAP_SAMPLE_RATE="0")
    client, _ = sync_client(openai_server(tokens=["a", "b", "c", "d"], usage=USAGE, delays=[0, 0, 0.001, 0.02, 0.001]))
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    attrs = attributes(captured.span())
    assert attrs[sc.CONTENT_CHUNKS] == 4
    assert 0.02 <= attrs[sc.MAX_CHUNK_GAP] < 0.03
    assert captured.points(sc.STABLE_NAMES.time_per_output_chunk.name) == []
    assert captured.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


def test_usage_injection_can_be_turned_off(instrument: Instrument) -> None:
    captured = instrument(OTEL_LLM_STREAM_USAGE="false")
    client, recorder = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert "stream_options" not in recorder.requests[0].json
    attrs = attributes(captured.span())
    assert sc.USAGE_OUTPUT_TOKENS not in attrs  # unknown stays unset
    assert sc.TIME_PER_OUTPUT_TOKEN not in attrs


@pytest.mark.parametrize("stream_options", [{"include_usage": True}, {"include_usage": False}])
def test_callers_own_stream_options_are_respected(otel: Captured, stream_options: dict[str, bool]) -> None:
    client, recorder = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                                 stream_options=stream_options))  # type: ignore[arg-type]
    assert recorder.requests[0].json["stream_options"] == stream_options
    asked = stream_options["include_usage"]
    assert (chunks[-1].usage is not None) is asked  # the caller gets the usage chunk exactly when it asked
    assert (sc.USAGE_OUTPUT_TOKENS in attributes(otel.span())) is asked


def test_callers_other_stream_options_are_kept(otel: Captured) -> None:
    client, recorder = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    options = {"include_obfuscation": False}
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                        stream_options=options))  # type: ignore[arg-type]
    assert recorder.requests[0].json["stream_options"] == {"include_obfuscation": False, "include_usage": True}
    assert options == {"include_obfuscation": False}  # the caller's dict is not mutated


def test_calls_inside_suppress_instrumentation_go_as_if_we_were_not_there(otel: Captured) -> None:
    client, recorder = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    with suppress_instrumentation():
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert "stream_options" not in recorder.requests[0].json  # nothing asked on our behalf
    assert len(chunks) == 4
    assert otel.spans() == [] and otel.metrics() == {}

    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert len(otel.spans()) == 1  # outside the block, as before


def test_stream_seen_by_caller_is_identical_with_and_without_us(instrument: Instrument) -> None:
    def read_all() -> list[str]:
        client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        return [chunk.model_dump_json(exclude_unset=True) for chunk in stream]

    without = read_all()
    instrument()
    assert read_all() == without


def test_rate_limit_gauges_keep_the_newest_response_not_the_last_to_finish(otel: Captured) -> None:
    early = wire.Reply.stream(wire.chat_stream(TOKENS), headers=wire.openai_ratelimit_headers(500, 100, 9000, 900))
    late = wire.Reply.json(wire.chat_completion_body("pq"), headers=wire.openai_ratelimit_headers(500, 50, 9000, 500))
    client, _ = sync_client([early, late])
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # headers: 100 left
    client.chat.completions.create(model="m", messages=MESSAGES)  # a later response: 50 left; finishes first
    list(stream)  # the stream finishes last, with the older headers
    remaining = otel.point(sc.STABLE_NAMES.rate_limit_remaining.name, otel_llm__rate_limit__resource="requests")
    assert remaining.value == 50


def test_rate_limit_gauges_keep_a_bounded_number_of_series(otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    """Model names without end (one per customer, say) must not grow what every collection reports: past the
    bound, the series first seen goes, as the SDK drops series past its own cardinality limit."""
    monkeypatch.setattr(_telemetry, "_MAX_LATEST", 3)
    headers = wire.openai_ratelimit_headers(500, 100, 9000, 900)
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("pq"), headers=headers) for _ in range(5)])
    for model in ("m0", "m1", "m2", "m3", "m4"):
        client.chat.completions.create(model=model, messages=MESSAGES)
    for name in (sc.STABLE_NAMES.rate_limit_remaining.name, sc.STABLE_NAMES.rate_limit_limit.name):
        # two resources (requests, tokens) per model: the three series seen last are m3's tokens and m4's two
        series = sorted((point.attributes[sc.REQUEST_MODEL], point.attributes[sc.RATE_LIMIT_RESOURCE])
                        for point in otel.points(name))
        assert series == [("m3", "tokens"), ("m4", "requests"), ("m4", "tokens")]


def test_rate_limit_gauges_keep_the_newest_response_when_threads_finish_together(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older response's operation that reads the store, then stores late (its thread paused in between), must
    not overwrite a newer response stored meanwhile by another thread."""
    older_thread = threading.current_thread()  # reassigned below

    class StoreThatPausesTheOlder(dict[Any, Any]):
        newer_stored = threading.Event()

        def __setitem__(self, key: Any, value: Any) -> None:
            if threading.current_thread() is older_thread:
                self.newer_stored.wait(0.5)  # long enough for the other thread, if nothing keeps it out
            super().__setitem__(key, value)
            if threading.current_thread() is not older_thread:
                self.newer_stored.set()

    monkeypatch.setattr(_telemetry, "_LATEST_REMAINING", StoreThatPausesTheOlder())
    otel = instrument()  # its gauge reads that store
    older = wire.Reply.json(wire.chat_completion_body("pq"), headers=wire.openai_ratelimit_headers(500, 100, 9, 9))
    newer = wire.Reply.json(wire.chat_completion_body("pq"), headers=wire.openai_ratelimit_headers(500, 50, 9, 9))
    client, _ = sync_client([older, newer])
    responded = threading.Event()

    def call_and_respond() -> None:
        client.chat.completions.create(model="m", messages=MESSAGES)  # arrives first, finishes last

    original_finish = _telemetry.Telemetry.finish

    def finish_after_signalling(self: Any, op: Any, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread() is older_thread:
            responded.set()
        original_finish(self, op, *args, **kwargs)

    monkeypatch.setattr(_telemetry.Telemetry, "finish", finish_after_signalling)
    older_thread = threading.Thread(target=call_and_respond)
    older_thread.start()
    assert responded.wait(5)
    client.chat.completions.create(model="m", messages=MESSAGES)  # the newer response, finished meanwhile
    older_thread.join(5)
    remaining = otel.point(sc.STABLE_NAMES.rate_limit_remaining.name, otel_llm__rate_limit__resource="requests")
    assert remaining.value == 50


@pytest.mark.timeout(10)
def test_a_call_finished_while_its_thread_stores_headroom_does_not_deadlock(otel: Captured) -> None:
    """A signal handler (SIGTERM closing what is open, say) may finish an operation on a thread that is in the
    middle of storing rate-limit headroom: the store's lock must let the same thread in."""
    headers = wire.openai_ratelimit_headers(500, 100, 9000, 900)
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("pq"), headers=headers)])
    with _telemetry._LATEST_LOCK:  # this thread, interrupted inside a store
        client.chat.completions.create(model="m", messages=MESSAGES)
    remaining = otel.point(sc.STABLE_NAMES.rate_limit_remaining.name, otel_llm__rate_limit__resource="requests")
    assert remaining.value == 100


def test_callers_extra_body_is_kept_and_its_stream_options_respected(otel: Captured) -> None:
    client, recorder = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    extra = {"top_k": 5, "stream_options": {"include_obfuscation": False}}
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True, extra_body=extra))
    sent = recorder.requests[0].json
    assert sent["top_k"] == 5
    assert sent["stream_options"] == {"include_obfuscation": False, "include_usage": True}
    assert extra == {"top_k": 5, "stream_options": {"include_obfuscation": False}}  # not mutated
    assert all(chunk.choices for chunk in chunks)  # the usage chunk we asked for stays hidden

    client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                   extra_body={"stream_options": {"include_usage": False}}).close()
    assert recorder.requests[1].json["stream_options"] == {"include_usage": False}  # the caller decided


@pytest.mark.parametrize("given, sent", [
    ({"stream_options": [["include_usage", False]]}, [["include_usage", False]]),
    ({"extra_body": {"stream_options": "x"}}, "x"),
    ({"stream_options": openai.omit}, {"include_usage": True}),
    ({"extra_body": {"stream_options": None}}, {"include_usage": True}),
], ids=["a list", "a string in extra_body", "omit", "null in extra_body"])
def test_stream_options_of_the_callers_own_kind_go_out_as_they_are(otel: Captured, given: dict[str, Any],
                                                                    sent: object) -> None:
    """What is not an object of options is the caller's to send (a strict server's to refuse); where the client
    sends none, or null, ours go."""
    client, recorder = sync_client([wire.Reply.stream(wire.chat_stream(TOKENS))])
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True, **given))
    assert recorder.requests[0].json["stream_options"] == sent


def test_usage_asked_in_extra_body_is_the_callers_even_beside_a_typed_stream_options(otel: Captured) -> None:
    # the client lays extra_body over the typed arguments: the server sees include_usage from extra_body
    client, recorder = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    chunks = list(client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_obfuscation": False},
        extra_body={"stream_options": {"include_usage": True}}))
    assert recorder.requests[0].json["stream_options"] == {"include_usage": True}
    assert chunks[-1].usage is not None and chunks[-1].choices == []  # the caller's own usage chunk reaches it
    assert sc.USAGE_INJECTED not in attributes(otel.span())


class _Body:
    """An extra_body that is not a Mapping but that the client merges all the same (it has keys())."""

    def keys(self) -> list[str]:
        return ["guided_json"]

    def __getitem__(self, key: str) -> object:
        return {"type": "object"}


def test_an_extra_body_of_the_callers_own_kind_is_sent_untouched(otel: Captured) -> None:
    client, recorder = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                        extra_body=_Body()))  # type: ignore[arg-type]
    assert recorder.requests[0].json["guided_json"] == {"type": "object"}
    assert "stream_options" not in recorder.requests[0].json  # we do not rebuild it to ask for usage


INSTRUMENTING_HOOKS = {
    # another library instruments LLM clients from a post-import hook, while this thread imports openai and
    # another thread calls instrument(): neither may wait on the other
    "from an importing thread": """
        in_hook = threading.Event()

        @wrapt.when_imported("openai")
        def other_library(module):
            in_hook.set()
            time.sleep(0.3)
            otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)

        def other_thread():
            in_hook.wait()
            otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)

        threads = [threading.Thread(target=lambda: __import__("openai")), threading.Thread(target=other_thread)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert not any(thread.is_alive() for thread in threads), "deadlocked"
    """,
    # the hook fires while instrument() itself imports the client's modules: no second instrumentation
    "inside instrument()": """
        @wrapt.when_imported("openai.resources.embeddings")
        def other_library(module):
            otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)

        import openai
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    """,
}


@pytest.mark.parametrize("hook", INSTRUMENTING_HOOKS, ids=INSTRUMENTING_HOOKS)
def test_instrument_called_from_another_librarys_import_hook_instruments_once(hook: str) -> None:
    program = textwrap.dedent("""
        import threading, time
        import wrapt, wire
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        import otel_llm

        exporter = InMemorySpanExporter()
        tracer_provider, meter_provider = TracerProvider(), MeterProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    """) + textwrap.dedent(INSTRUMENTING_HOOKS[hook]) + textwrap.dedent("""
        import openai
        http, _ = wire.mock_client([wire.Reply.json(wire.chat_completion_body("pq"))])
        client = openai.OpenAI(api_key="k", http_client=http, max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        print(len(exporter.get_finished_spans()))
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1"]


def test_a_set_up_that_fails_half_way_leaves_nothing_behind(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A broken install (a client module without a spec) after the telemetry is made: logged, nothing patched,
    no thread of ours, and instrument() may be called again."""
    monkeypatch.setitem(sys.modules, "anthropic", types.ModuleType("anthropic"))
    cls = openai.resources.chat.completions.completions.Completions
    original = vars(cls)["create"]
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    try:
        assert "otel_llm: cannot set up its telemetry; not instrumenting" in caplog.messages
        assert vars(cls)["create"] is original
        assert not otel_llm.OtelLLMInstrumentor().is_instrumented_by_opentelemetry
        deadline = time.monotonic() + 5
        while [t for t in threading.enumerate() if t.name == "otel_llm-writer"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [t for t in threading.enumerate() if t.name == "otel_llm-writer"] == []
    finally:
        otel_llm.uninstrument()


def test_a_child_forked_while_another_thread_is_inside_instrument_can_instrument() -> None:
    program = textwrap.dedent("""
        import os, threading
        import openai, wire
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        import otel_llm
        from otel_llm import _instrumentor

        exporter = InMemorySpanExporter()
        tracer_provider, meter_provider = TracerProvider(), MeterProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        load, entered, release = _instrumentor.load_settings, threading.Event(), threading.Event()

        def slow_load():  # a set-up under way in another thread
            entered.set()
            release.wait()
            return load()

        _instrumentor.load_settings = slow_load
        other = threading.Thread(target=otel_llm.instrument,
                                 kwargs={"tracer_provider": tracer_provider, "meter_provider": meter_provider})
        other.start()
        entered.wait()
        child = os.fork()
        if child == 0:
            _instrumentor.load_settings = load
            otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
            http, _ = wire.mock_client([wire.Reply.json(wire.chat_completion_body("pq"))])
            openai.OpenAI(api_key="k", http_client=http, max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
            print(len(exporter.get_finished_spans()), flush=True)
            os._exit(0)
        release.set()
        other.join()
        os.waitpid(child, 0)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1"]


def test_threads_calling_instrument_together_are_all_instrumented_when_it_returns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread's instrument() returns once instrumentation is in place: its next call is recorded, once, and
    one writer thread runs."""
    load = _instrumentor.load_settings

    def slow_load() -> Any:
        time.sleep(0.2)
        return load()

    monkeypatch.setattr(_instrumentor, "load_settings", slow_load)
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider()
    start = threading.Barrier(4)

    def work() -> None:
        start.wait()
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("pq"))])
        client.chat.completions.create(model="m", messages=MESSAGES)

    threads = [threading.Thread(target=work) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(exporter.get_finished_spans()) == 4  # one each: patched once
        assert [thread.name for thread in threading.enumerate() if thread.name == "otel_llm-writer"] == [
            "otel_llm-writer"]
    finally:
        otel_llm.uninstrument()


def test_an_interrupted_instrument_leaves_nothing_half_done(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the set-up, once the telemetry is made: it propagates, and a later instrument() instruments."""
    find_spec = importlib.util.find_spec

    def interrupted(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "openai":
            raise KeyboardInterrupt
        return find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", interrupted)
    with pytest.raises(KeyboardInterrupt):
        otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider())
    try:
        client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("pq"))])
        client.chat.completions.create(model="m", messages=MESSAGES)
        assert len(exporter.get_finished_spans()) == 1
    finally:
        otel_llm.uninstrument()
