"""Shared fixtures: instrumentation into in-memory exporters, and openai clients on wire fakes."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import logging
import os
import pickle

# our own failures must fail the tests instead of being logged and swallowed; set before otel_llm is imported
os.environ["OTEL_LLM_STRICT"] = "1"

from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import wire
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import otel_llm
from otel_llm import _safety, _telemetry
from otel_llm import _semconv as sc

# what a finalizer ended waits for the next call or collection, as tests expect: no timed writes in between
_telemetry.LATER_WAIT_S = None
# OTEL_LLM_TEST_SPANS=batch: spans go through the SDK's BatchSpanProcessor, so they are made when written, after
# the operation (see otel_llm._spans); a test reads them after what waits is written. Otherwise a SimpleSpanProcessor
# exports each as it ends.
BATCHED_SPANS = os.environ.get("OTEL_LLM_TEST_SPANS") == "batch"
# aiobotocore pins botocore below boto3's latest: its tests run in venvs of their own (scripts/test)
collect_ignore = [] if importlib.util.find_spec("aiobotocore") else ["test_aiobotocore.py"]

API_KEY = "sk-test-secret-key-123"
BASE_URL = "https://api.openai.com/v1"


@dataclass
class Captured:
    """What the instrumentation wrote, read through the SDK's own in-memory exporter and reader."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    processor: SpanProcessor | None = None  # where it is a BatchSpanProcessor, spans() flushes it

    def spans(self) -> list[ReadableSpan]:
        if isinstance(self.processor, BatchSpanProcessor):  # what waits for the writer thread, then the exporter
            _telemetry.write_later(_telemetry._DEFERRED)
            # the SDK's own flush: the one otel_llm gives the processor would write what a finalizer ended too,
            # which the tests see written by the next call or collection
            BatchSpanProcessor.force_flush(self.processor)
        return list(self.exporter.get_finished_spans())

    def span(self) -> ReadableSpan:
        spans = self.spans()
        assert len(spans) == 1, f"expected exactly one span, got {[s.name for s in spans]}"
        return spans[0]

    def metrics(self) -> dict[str, list[Any]]:
        """metric name -> its data points (cumulative since instrument())."""
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        if data is None:
            return found
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def points(self, name: str, **attributes: Any) -> list[Any]:
        """Data points of ``name`` whose attributes include ``attributes`` (dots spelled as keys)."""
        wanted = {key.replace("__", "."): value for key, value in attributes.items()}
        return [
            point for point in self.metrics().get(name, [])
            if all(point.attributes.get(key) == value for key, value in wanted.items())
        ]

    def point(self, name: str, **attributes: Any) -> Any:
        points = self.points(name, **attributes)
        assert len(points) == 1, f"{name}: expected one point, got {[dict(p.attributes) for p in points]}"
        return points[0]

    def assert_finished(self, error_type: str | None) -> None:
        """The operation finished exactly once, with ``error_type`` (None: no error) on its span and duration."""
        span = self.span()  # exactly one span: the operation finished once
        assert attributes(span).get(sc.ERROR_TYPE) == error_type
        assert span.status.status_code is (StatusCode.ERROR if error_type else StatusCode.UNSET)
        duration = self.point(sc.STABLE_NAMES.duration.name)
        assert duration.count == 1
        assert duration.attributes.get(sc.ERROR_TYPE) == error_type

    def assert_abandoned_at_first_token(self) -> None:
        """A stream collected unfinished after its first token: nothing is written from the garbage collector's
        finalizer; the next metric collection writes it, ended where activity was last seen."""
        assert self.spans() == []
        self.metrics()
        self.assert_finished(sc.ERROR_ABANDONED)
        self.assert_ended_at_first_token()

    def assert_ended_at_first_token(self) -> None:
        """An abandoned stream read up to its first token ended where activity was last seen, not at collection."""
        span = self.span()
        assert span.end_time is not None and span.start_time is not None
        assert (span.end_time - span.start_time) / 1e9 == pytest.approx(
            attributes(span)[sc.RESPONSE_TIME_TO_FIRST_CHUNK], abs=1e-6)


def cancel_midway(consume: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``consume()`` as a task and cancel it 0.1 s in, as asyncio cancels a request handler."""

    async def main() -> None:
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


Instrument = Callable[..., Captured]


@pytest.fixture
def instrument(monkeypatch: pytest.MonkeyPatch) -> Iterator[Instrument]:
    """instrument(**env) -> Captured: instruments with in-memory providers after setting ``env``."""

    def start(sampler: Any = None, **env: str) -> Captured:
        monkeypatch.setenv("OTEL_LLM_CHUNK_GAP_SAMPLE_RATE", "1")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
        processor = BatchSpanProcessor(exporter) if BATCHED_SPANS else SimpleSpanProcessor(exporter)
        tracer_provider.add_span_processor(processor)
        reader = InMemoryMetricReader()
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]))
        return Captured(exporter, reader, tracer_provider, processor)

    yield start
    otel_llm.uninstrument()


@pytest.fixture
def otel(instrument: Instrument) -> Captured:
    return instrument()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timing: compares clocks within milliseconds (every test using steady_clock "
                                       "is one): scripts/test runs these alone, never beside another test run, and "
                                       "a failed comparison again, twice at most")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "steady_clock" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timing)


@pytest.fixture
def steady_clock() -> Iterator[None]:
    """No garbage collection while a test compares our clock reads with the caller's: a collection of the whole
    suite's heap can pause the thread for milliseconds between the two, which is neither side's error."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def openai_server(*, tokens: list[str], usage: wire.Usage, **stream_options: Any) -> Callable[
        [wire.RecordedRequest], wire.Reply]:
    """A chat-completions endpoint that behaves like OpenAI's: usage arrives in a last chunk only when asked."""

    def answer(request: wire.RecordedRequest) -> wire.Reply:
        body = request.json
        if not body.get("stream"):
            return wire.Reply.json(wire.chat_completion_body("".join(tokens), usage=usage))
        asked = (body.get("stream_options") or {}).get("include_usage") is True
        return wire.Reply.stream(wire.chat_stream(tokens, usage=usage if asked else None), **stream_options)

    return answer


def sync_client(replies: wire.ReplySource, **options: Any) -> tuple[openai.OpenAI, wire.Recorder]:
    http, recorder = wire.mock_client(replies)
    options = {"max_retries": 0, **options}
    return openai.OpenAI(api_key=API_KEY, base_url=BASE_URL, http_client=http, **options), recorder


def async_client(replies: wire.ReplySource, **options: Any) -> tuple[openai.AsyncOpenAI, wire.Recorder]:
    http, recorder = wire.mock_client(replies, async_=True)
    options = {"max_retries": 0, **options}
    return openai.AsyncOpenAI(api_key=API_KEY, base_url=BASE_URL, http_client=http, **options), recorder


def attributes(span: ReadableSpan) -> Mapping[str, Any]:
    assert span.attributes is not None
    return span.attributes


# each item a caller got, as JSON of the fields it was given (what its to_dict() and to_json() write); the class of
# the error it got, if any
Received = tuple[list[str], str | None]


def received(call: Callable[[], Iterable[Any]]) -> Received:
    """What a caller gets reading the stream ``call()`` hands it: every item, then the client's exception if any."""
    items: list[str] = []
    try:
        for item in call():
            items.append(item.model_dump_json(warnings=False, exclude_unset=True))
    except Exception as error:
        return items, type(error).__name__
    return items, None


def pickling_error(obj: object) -> tuple[type[BaseException], str]:
    """What pickling ``obj`` raises: its type and message."""
    with pytest.raises(Exception) as raised:
        pickle.dumps(obj)
    return type(raised.value), str(raised.value)


def assert_read_alike_and_recorded(instrument: Instrument, monkeypatch: pytest.MonkeyPatch,
                                   caplog: pytest.LogCaptureFixture, cases: Sequence[Any],
                                   read: Callable[[Any], Received], without: Sequence[Received]) -> None:
    """Instrumented, with our own failures logged rather than raised: each case reads as it did without us
    (``without``); every call ends in one span and one duration; and our only failures are chunks we could not
    read (logged, skipped)."""
    monkeypatch.setattr(_safety, "strict", False)
    otel = instrument()
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        for case, expected in zip(cases, without, strict=True):
            monkeypatch.setattr(_safety, "_reported", set())  # every failure logged, not only each site's first
            assert read(case) == expected
    assert len(otel.spans()) == len(cases)
    assert sum(point.count for point in otel.points(sc.STABLE_NAMES.duration.name)) == len(cases)
    assert {record.getMessage() for record in caplog.records} == {
        "otel_llm: internal failure in stream chunk; telemetry for this call is incomplete"}
