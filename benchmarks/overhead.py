"""Overhead of otel_llm against the uninstrumented openai client, in one process.

    .venv/bin/python benchmarks/overhead.py            # full run, a few minutes
    .venv/bin/python benchmarks/overhead.py --quick    # a smoke run (the test suite runs this)

Three views, all in this thread's CPU time (other processes on a shared 2-core machine do not move it):

1. End to end, side by side: the real openai client reads real SSE bytes from its own in-process transport (no
   network, no sleeps), so the client's own work is the baseline. Uninstrumented and instrumented requests
   alternate one by one; the figure is the median of the paired differences, with how far that median moves within
   the run. The client spends ~100 us per chunk with a spread of several percent, so per-chunk differences of a
   microsecond drown in it here: view 2 measures them.
2. Our code alone, on the same real objects: the chunk path (real ChatCompletionChunk objects through our proxy
   and adapter, against iterating them bare), the finish (span end and every histogram record, real SDK
   pipeline) for 16/256/1024-chunk streams, and the whole non-streaming wrapper around a call that returns a real
   ChatCompletion. Per chunk in total = chunk path + the finish's cost per extra chunk (the sampled gap records).
3. End to end as in 1, under what a user can choose that changes our cost: spans sampled out (a sampler that
   records none, as a low trace ratio does for most requests), no usage asked for on streams
   (OTEL_LLM_STREAM_USAGE=false), and both; and the least a stream can cost us: no usage asked for and no chunk gaps
   recorded (OTEL_LLM_CHUNK_GAP_SAMPLE_RATE=0); and no chunk gaps recorded, usage asked for as shipped. Each run
   checks that its configuration took effect.
4. The floor, as in 1 but without otel_llm: the client's own requests against the same requests each inside one SDK
   span (started with the five attributes that name a GenAI operation, ended once the response is read). The least
   that any instrumentation recording a span adds here, before it measures or records anything. And the least a
   conforming one adds: for a non-streamed call, that span with the response's attributes, and the duration and
   token counts recorded through the SDK's public API; for a stream, that span with the response's attributes and
   the time to the first content chunk, found as the chunks pass, and the duration and that time recorded (one that
   asks for no usage and records no chunk gaps, as the fourth configuration of 3). Then what asking for usage costs
   the client itself (the request's extra field, and the usage event read and decoded, then hidden before the client
   builds a chunk of it; nothing recorded), and the least a conforming stream instrumentation records asking for
   usage, as otel_llm does: the same, with the token counts and time per output token recorded too (compare the
   last configuration of 3).

Telemetry goes to a real SDK pipeline: a TracerProvider with a BatchSpanProcessor (exporter dropping spans) and a
MeterProvider with an in-memory reader. Under a BatchSpanProcessor, a finished operation waits for otel_llm's writer
thread, which makes its span and hands its histogram values to a batch, 32 operations at a time; the histogram
values wait until a reader collects. Here that thread writes nothing: every collection, every 32 requests (the
writer's batch), writes what waits on the calling thread, and the work of that and of adding the values is counted
in every view, shared out over the requests since the previous collection (so rather more, for the values, than
with a real exporter's 15-60 s). The SDK's own collection work, the same with or without us, is not.
Memory: RSS growth over N streamed requests after a warm-up, content capture off, spans made by the writer thread.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import httpx2
import openai
import wrapt
from openai.resources.chat.completions.completions import AsyncCompletions, Completions
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.util.types import AttributeValue

import otel_llm
from otel_llm import _telemetry
from otel_llm._calls import sync_call
from otel_llm._export import sdk_enabled
from otel_llm._operation import Operation
from otel_llm._settings import GAP_SAMPLE_RATE_ENV, STREAM_USAGE_ENV, Settings, load_settings
from otel_llm._stream import StreamProxy
from otel_llm._telemetry import Telemetry
from otel_llm.providers import openai as openai_adapter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import wire

MESSAGES = [{"role": "user", "content": "Write a haiku about latency."}]
# CPU time of this thread: what the client and we spend, unmoved by other processes on a shared 2-core machine
_now = time.thread_time_ns


class _DropSpans(SpanExporter):
    def __init__(self) -> None:
        self.dropped = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.dropped += len(spans)
        return SpanExportResult.SUCCESS


def _body(chunks: int) -> tuple[list[bytes], bytes]:
    tokens = [f" w{i}" for i in range(chunks)]
    usage = wire.Usage(input=12, output=chunks)
    events = wire.chat_stream(tokens, usage=usage)
    plain = wire._compact(wire.chat_completion_body("".join(tokens), usage=usage)).encode()
    return events, plain


def _handler(events: list[bytes], plain: bytes) -> Callable[[httpx2.Request], httpx2.Response]:
    headers_stream = {"content-type": "text/event-stream", **wire.openai_ratelimit_headers(500, 499, 9000, 8000)}
    headers_plain = {"content-type": "application/json", **wire.openai_ratelimit_headers(500, 499, 9000, 8000)}
    with_usage, without_usage = events, [e for e in events if b'"choices":[]' not in e]

    def handle(request: httpx2.Request) -> httpx2.Response:
        if b'"stream":true' not in request.content:
            return httpx2.Response(200, headers=headers_plain, content=plain)
        body = with_usage if b'"include_usage":true' in request.content else without_usage
        return httpx2.Response(200, headers=headers_stream, content=iter(body))

    return handle


def client_for(chunks: int) -> openai.OpenAI:
    """The real client over its own transport: streams of ``chunks`` content chunks, or one completion as long."""
    events, plain = _body(max(chunks, 1))
    transport = httpx2.MockTransport(_handler(events, plain))
    return openai.OpenAI(api_key="k", http_client=httpx2.Client(transport=transport))


def _async_handler(events: list[bytes], plain: bytes) -> Callable[[httpx2.Request], Any]:
    sync = _handler(events, plain)

    async def handle(request: httpx2.Request) -> httpx2.Response:
        response = sync(request)
        if response.headers["content-type"] == "application/json":
            return response
        body = list(response.stream)  # type: ignore[arg-type]

        async def stream() -> Any:
            for event in body:
                yield event

        return httpx2.Response(200, headers=response.headers, content=stream())

    return handle


def run_sync_stream(client: openai.OpenAI, create: Callable[..., Any] | None = None) -> None:
    """One streamed request read to its end; ``create`` defaults to the client's (instrumented or not)."""
    for _chunk in (create or client.chat.completions.create)(model="gpt-4o-mini", messages=MESSAGES, stream=True):
        pass


def run_plain(client: openai.OpenAI, create: Callable[..., Any] | None = None) -> Any:
    return (create or client.chat.completions.create)(model="gpt-4o-mini", messages=MESSAGES)


async def run_async_stream(client: openai.AsyncOpenAI, create: Callable[..., Any] | None = None) -> None:
    async for _chunk in await (create or client.chat.completions.create)(model="gpt-4o-mini", messages=MESSAGES,
                                                                          stream=True):
        pass


@dataclass
class Workload:
    name: str
    chunks: int  # content chunks per response (0: not streamed)
    pairs: int  # requests each way
    is_async: bool = False


@dataclass(frozen=True)
class Configuration:
    """What a user can choose that changes our cost: whether spans are sampled, whether streams ask for usage,
    whether a stream's chunk gaps are recorded (OTEL_LLM_CHUNK_GAP_SAMPLE_RATE 1 or 0)."""

    name: str
    sampled: bool = True
    stream_usage: bool = True
    chunk_gaps: bool = True

    def environment(self) -> dict[str, str]:
        """What instrument() reads of it."""
        return {STREAM_USAGE_ENV: str(self.stream_usage).lower(), GAP_SAMPLE_RATE_ENV: "1" if self.chunk_gaps else "0"}


def _pipeline(sampler: Sampler = ALWAYS_ON,
              exporter: SpanExporter | None = None) -> tuple[TracerProvider, MeterProvider, InMemoryMetricReader]:
    # the sampler given, never one OTEL_TRACES_SAMPLER names: as shipped, every span is recorded
    tracer_provider = TracerProvider(sampler=sampler)
    # a queue that does not fill up between the exporter thread's turns: dropping spans would be cheaper than ending
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter or _DropSpans(), max_queue_size=1 << 20))
    reader = InMemoryMetricReader()
    return tracer_provider, MeterProvider(metric_readers=[reader]), reader


# requests between two collections, over which the work of writing what waited and adding the batch's values is
# shared: the writer thread's batch
COLLECT_EVERY = 32
assert _telemetry.WRITE_BATCH == COLLECT_EVERY


def write_now(telemetry: Telemetry) -> None:
    """What a collection writes: the operations waiting for the writer thread (see main), and the batch's values."""
    _telemetry.write_later(_telemetry._DEFERRED)
    telemetry._batch.flush()


def adding_ns(reader: InMemoryMetricReader) -> int:
    """CPU ns a collection spends adding the values our batch holds: that collection, less the next one (the
    SDK's own work, with nothing waiting)."""
    start = _now()
    reader.collect()
    with_values = _now() - start
    start = _now()
    reader.collect()
    return max(0, with_values - (_now() - start))


def side_by_side(workload: Workload,
                 configuration: Configuration = Configuration("as shipped")) -> tuple[float, float, float, float]:
    """Median CPU time per request off and on, the median of the paired differences, and how far that median moves
    within the run (max - min over ten interleaved tenths of the pairs), in us.

    Instrumentation stays installed; an uninstrumented request calls the client's own create() from under our patch,
    so the two kinds alternate request by request (which one goes first alternates too) and the machine's drift
    cancels out pair by pair. The uninstrumented request still passes our response-header hook, which steps aside at
    once (a few hundred ns). Instrumented under ``configuration``: its sampler and usage setting, checked afterwards
    to have taken effect."""
    exporter = _DropSpans()
    tracer_provider, meter_provider, reader = _pipeline(ALWAYS_ON if configuration.sampled else ALWAYS_OFF, exporter)
    environment = configuration.environment()
    before = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    try:
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    try:
        measured = _alternate(workload, lambda run, client, bare: run(client), lambda: adding_ns(reader))
    finally:
        otel_llm.uninstrument()
        tracer_provider.shutdown()
    _check(configuration, workload, exporter.dropped, reader)
    return _summary(measured)


# the five attributes that name a GenAI operation, as every floor's span starts with them
FLOOR_ATTRIBUTES: dict[str, AttributeValue] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                                               "gen_ai.request.model": "gpt-4o-mini",
                                               "server.address": "api.openai.com", "server.port": 443}


# what the "on" request of a pair runs: (run, client, the client's own create) -> the result
Instrumented = Callable[[Callable[..., Any], Any, Callable[..., Any]], Any]


def floor(workload: Workload, floor_of: Callable[[Tracer, Meter, Workload], Instrumented]) -> tuple[
        float, float, float, float]:
    """As ``side_by_side``, with otel_llm not installed: the "on" request is what ``floor_of`` makes of the workload
    with a tracer and a meter of a pipeline of its own."""
    tracer_provider, meter_provider, _ = _pipeline()
    instrumented = floor_of(tracer_provider.get_tracer("floor"), meter_provider.get_meter("floor"), workload)
    try:
        return _summary(_alternate(workload, instrumented, lambda: 0))
    finally:
        tracer_provider.shutdown()


def span_floor(tracer: Tracer, meter: Meter, workload: Workload) -> Instrumented:
    """The client's own request inside one SDK span started with the five attributes that name a GenAI operation
    and ended after the response is read to its end: the least any instrumentation that records a span adds, before
    it measures or records anything."""
    attributes = FLOOR_ATTRIBUTES

    def in_a_span(run: Callable[..., Any], client: Any, bare: Callable[..., Any]) -> Any:
        span = tracer.start_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes=attributes)
        try:
            return run(client, bare)
        finally:
            span.end()

    async def in_a_span_async(run: Callable[..., Any], client: Any, bare: Callable[..., Any]) -> Any:
        span = tracer.start_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes=attributes)
        try:
            return await run(client, bare)
        finally:
            span.end()

    return in_a_span_async if workload.is_async else in_a_span


def minimal_floor(tracer: Tracer, meter: Meter, workload: Workload) -> Instrumented:
    """As ``span_floor`` for a non-streamed call, with what the least conforming instrumentation records too: the
    span's response attributes (id, model, finish reasons, token counts) and the duration and the two token counts
    through the SDK's public ``Histogram.record()``. No context made current, no headers, no prompt length."""
    duration = meter.create_histogram("gen_ai.client.operation.duration", unit="s")
    tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}")
    attributes = FLOOR_ATTRIBUTES

    def recorded(run: Callable[..., Any], client: Any, bare: Callable[..., Any]) -> Any:
        span = tracer.start_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes=attributes)
        start = time.perf_counter()
        completion = run(client, bare)
        usage = completion.usage
        span.set_attributes({"gen_ai.response.id": completion.id, "gen_ai.response.model": completion.model,
                             "gen_ai.response.finish_reasons": [choice.finish_reason for choice in completion.choices],
                             "gen_ai.usage.input_tokens": usage.prompt_tokens,
                             "gen_ai.usage.output_tokens": usage.completion_tokens})
        recorded_attributes = {**attributes, "gen_ai.response.model": completion.model}
        duration.record(time.perf_counter() - start, recorded_attributes)
        tokens.record(usage.prompt_tokens, {**recorded_attributes, "gen_ai.token.type": "input"})
        tokens.record(usage.completion_tokens, {**recorded_attributes, "gen_ai.token.type": "output"})
        span.end()
        return completion

    return recorded


def stream_floor(tracer: Tracer, meter: Meter, workload: Workload, *, usage: bool = False) -> Instrumented:
    """As ``minimal_floor`` for a synchronous stream: the least a conforming instrumentation records of one that
    records no chunk gaps (which DESIGN.md lets it sample per stream): the span, the time of the first content chunk,
    found by looking at each chunk as it passes, and the span's response attributes, and the duration and time to
    first chunk through ``Histogram.record()``. Asking for no usage, it knows no token counts and no time per output
    token: compare with otel_llm configured the same way (section 3). With ``usage``, it asks for usage as otel_llm
    does and hides the usage chunk from the caller the cheapest way there is (``_hiding_usage``), and records the two
    token counts and the time per output token too: compare with otel_llm recording no chunk gaps."""
    if workload.chunks == 0 or workload.is_async:
        raise ValueError("the streamed floor is measured for synchronous streams")
    duration = meter.create_histogram("gen_ai.client.operation.duration", unit="s")
    first_chunk = meter.create_histogram("gen_ai.client.operation.time_to_first_chunk", unit="s")
    tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}")
    per_token = meter.create_histogram("gen_ai.client.operation.time_per_output_chunk", unit="s")
    attributes = FLOOR_ATTRIBUTES
    extra = {"extra_body": {"stream_options": {"include_usage": True}}} if usage else {}

    def recorded(run: Callable[..., Any], client: Any, bare: Callable[..., Any]) -> None:
        span = tracer.start_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes=attributes)
        start = time.perf_counter()
        first = 0.0
        response_id: str | None = None
        response_model: str | None = None
        finish_reasons: list[str] = []
        stream = bare(model="gpt-4o-mini", messages=MESSAGES, stream=True, **extra)
        counts = _hiding_usage(stream) if usage else {}
        for chunk in stream:
            choices = chunk.choices
            if not choices:
                continue
            if not first and choices[0].delta.content:
                first = time.perf_counter()
            if choices[0].finish_reason:
                finish_reasons.append(choices[0].finish_reason)
            response_id, response_model = chunk.id, chunk.model
        end = time.perf_counter()
        span.set_attributes({"gen_ai.response.id": response_id, "gen_ai.response.model": response_model,
                             "gen_ai.response.finish_reasons": finish_reasons, "gen_ai.request.stream": True,
                             "gen_ai.response.time_to_first_chunk": first - start})
        recorded_attributes = {**attributes, "gen_ai.response.model": response_model, "gen_ai.request.stream": True}
        duration.record(end - start, recorded_attributes)
        first_chunk.record(first - start, recorded_attributes)
        if usage:
            input_tokens, output_tokens = counts["prompt_tokens"], counts["completion_tokens"]
            span.set_attributes({"gen_ai.usage.input_tokens": input_tokens,
                                 "gen_ai.usage.output_tokens": output_tokens})
            tokens.record(input_tokens, {**recorded_attributes, "gen_ai.token.type": "input"})
            tokens.record(output_tokens, {**recorded_attributes, "gen_ai.token.type": "output"})
            per_token.record((end - first) / (output_tokens - 1), recorded_attributes)
        span.end()

    return recorded


def usage_floor(tracer: Tracer, meter: Meter, workload: Workload) -> Instrumented:
    return stream_floor(tracer, meter, workload, usage=True)


def asked_usage(tracer: Tracer, meter: Meter, workload: Workload) -> Instrumented:
    """The client's own request asking for usage, its usage chunk hidden as ``stream_floor`` hides it, and nothing
    recorded: what the usage costs the client itself (the request's extra field, the usage event read off the wire
    and decoded), which any instrumentation that asks for it pays on top of its own work."""

    def asking(run: Callable[..., Any], client: Any, bare: Callable[..., Any]) -> None:
        stream = bare(model="gpt-4o-mini", messages=MESSAGES, stream=True,
                      extra_body={"stream_options": {"include_usage": True}})
        counts = _hiding_usage(stream)
        for _chunk in stream:
            pass
        if not counts:
            raise RuntimeError("the usage asked for did not come")

    return asking


def _hiding_usage(stream: Any) -> dict[str, Any]:
    """The usage event taken out of ``stream`` as its SSE decoder decodes it, before the client builds a chunk of it
    (which costs the client about half of what a content chunk does), by a test of its text that suits this server's
    compact JSON only: the usage it held, once the stream has been read."""
    found: dict[str, Any] = {}
    decoder = stream._decoder
    decode = decoder.decode

    def hiding(line: str) -> Any:
        event = decode(line)
        if event is not None and '"choices":[]' in event.data:
            found.update(json.loads(event.data)["usage"])
            return None
        return event

    decoder.decode = hiding
    return found


def _alternate(workload: Workload, instrumented: Instrumented, adding: Callable[[], int]) -> list[tuple[int, int]]:
    """(off, on) CPU ns per pair, each timed around the whole request: the client's own create() against
    ``instrumented(run, client, bare_create)``,
    alternating request by request, each "on" with its share of ``adding`` (the next collection's work), run every
    COLLECT_EVERY pairs; after a warm-up of a tenth as many."""
    events, plain = _body(max(workload.chunks, 1))
    if workload.is_async:
        aclient = openai.AsyncOpenAI(api_key="k", http_client=httpx2.AsyncClient(
            transport=httpx2.MockTransport(_async_handler(events, plain))))
        abare = _own_create(AsyncCompletions, aclient.chat.completions)

        async def timed_async(request: Awaitable[Any]) -> int:
            start = _now()
            await request
            return _now() - start

        async def pairs_async(count: int) -> list[tuple[int, int]]:
            found = []
            for index in range(count):
                if index % 2:
                    on = await timed_async(instrumented(run_async_stream, aclient, abare))
                    off = await timed_async(run_async_stream(aclient, abare))
                else:
                    off = await timed_async(run_async_stream(aclient, abare))
                    on = await timed_async(instrumented(run_async_stream, aclient, abare))
                found.append((off, on))
            return found

        def pairs(count: int) -> list[tuple[int, int]]:
            return asyncio.run(pairs_async(count))
    else:
        client = client_for(workload.chunks)
        run = run_sync_stream if workload.chunks else run_plain
        bare = _own_create(Completions, client.chat.completions)

        def timed(request: Callable[[], Any]) -> int:
            start = _now()
            request()
            return _now() - start

        def pairs(count: int) -> list[tuple[int, int]]:
            found = []
            for index in range(count):
                if index % 2:
                    on = timed(lambda: instrumented(run, client, bare))
                    off = timed(lambda: run(client, bare))
                else:
                    off = timed(lambda: run(client, bare))
                    on = timed(lambda: instrumented(run, client, bare))
                found.append((off, on))
            return found

    def collected_pairs(count: int) -> list[tuple[int, int]]:
        found = []
        for start in range(0, count, COLLECT_EVERY):
            block = pairs(min(COLLECT_EVERY, count - start))
            share = adding() // len(block)
            found += [(off, on + share) for off, on in block]
        return found

    collected_pairs(max(10, workload.pairs // 10))  # warm caches and the client's pools
    gc.collect()
    return collected_pairs(max(10, workload.pairs))  # ten at least: the spread is over tenths


def _own_create(resource_class: type, resource: Any) -> Callable[..., Any]:
    """The client's own create(): from under our patch while otel_llm is installed."""
    create = vars(resource_class)["create"]
    if isinstance(create, wrapt.FunctionWrapper):
        return functools.partial(create.__wrapped__, resource)
    return resource.create  # type: ignore[no-any-return]


def _summary(measured: list[tuple[int, int]]) -> tuple[float, float, float, float]:
    differences = [on - off for off, on in measured]
    tenths = [statistics.median(differences[start::10]) for start in range(10)]
    return (statistics.median(off for off, _ in measured) / 1e3, statistics.median(on for _, on in measured) / 1e3,
            statistics.median(differences) / 1e3, (max(tenths) - min(tenths)) / 1e3)


def _check(configuration: Configuration, workload: Workload, spans: int, reader: InMemoryMetricReader) -> None:
    """The figures are the configuration's: spans only when sampled; a stream's TPOT (which needs its output-token
    count) only when we asked for usage, since the server here sends usage only when asked; its chunk gaps only
    when recorded."""
    names = load_settings().metric_names
    values = {names.time_per_output_token.name: 0, names.time_per_output_chunk.name: 0}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name in values:
                    values[metric.name] += sum(point.count for point in metric.data.data_points
                                               if isinstance(point, HistogramDataPoint))
    tpot_values, gap_values = values.values()
    if (spans > 0) != configuration.sampled or (workload.chunks and (
            (tpot_values > 0) != configuration.stream_usage or (gap_values > 0) != configuration.chunk_gaps)):
        raise RuntimeError(f"{configuration.name}, {workload.name}: {spans} spans, {tpot_values} TPOT values and "
                           f"{gap_values} chunk gaps recorded, not what the configuration makes")


def _real_chunks(count: int) -> list[Any]:
    client = client_for(count)
    return list(client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True,
                                               stream_options={"include_usage": True}))


def _best(fn: Callable[[], int], repeat: int) -> int:
    return min(fn() for _ in range(repeat))


def chunk_path_ns(chunks: list[Any], telemetry: Telemetry, repeat: int) -> float:
    """CPU ns per chunk that our proxy and adapter add while a stream hands chunks to the caller."""
    endpoint = openai_adapter._CHAT
    request = endpoint.describe(openai.OpenAI(api_key="k").chat.completions,
                                {"model": "m", "messages": MESSAGES, "stream": True}, telemetry.settings)
    count = len(chunks) - 1  # stop before the end: the finish is measured on its own

    # read with a for loop, as callers do (iter() of the proxy is a generator calling its step)
    def bare() -> int:
        iterator = iter(chunks)
        start = _now()
        for _ in islice(iterator, count):
            pass
        return _now() - start

    def proxied() -> int:
        op = telemetry.begin(request)
        # as prepare() makes it when the caller asked for no usage: its chunks then go on as they come unasked
        op.hide_usage_chunk = telemetry.settings.stream_usage
        proxy = StreamProxy(iter(chunks), op, telemetry, endpoint.observe, endpoint.read_error)
        start = _now()
        for _ in islice(proxy, count):
            pass
        elapsed = _now() - start
        op.finished = True  # not measured here; keeps the finalizer from recording an abandoned stream
        return elapsed

    return (_best(proxied, repeat) - _best(bare, repeat)) / count


def finish_ns(content_chunks: int, telemetry: Telemetry, repeat: int, *, gaps: bool) -> float:
    """CPU ns of one stream's finish: span end and every record, and every gap record when ``gaps``; with its share
    of adding the batch's values at the next collection."""
    endpoint = openai_adapter._CHAT
    chunks = _real_chunks(content_chunks)
    request = endpoint.describe(openai.OpenAI(api_key="k").chat.completions,
                                {"model": "m", "messages": MESSAGES, "stream": True}, telemetry.settings)

    def streamed() -> tuple[Operation, StreamProxy]:
        op = telemetry.begin(request)
        op.record_gaps = gaps
        proxy = StreamProxy(iter(chunks), op, telemetry, endpoint.observe, endpoint.read_error)
        for _ in range(len(chunks) - 1):
            next(proxy)
        return op, proxy  # the proxy kept: collected, it would finish the operation as abandoned

    def block() -> float:
        streams = [streamed() for _ in range(COLLECT_EVERY)]
        start = _now()
        for op, _ in streams:
            telemetry.finish(op)
        write_now(telemetry)
        return (_now() - start) / COLLECT_EVERY

    return statistics.median(block() for _ in range(repeat))


def plain_finish_ns(telemetry: Telemetry, repeat: int) -> float:
    """CPU ns of a non-streamed operation's finish (span end, duration, prompt length and usage records)."""
    endpoint = openai_adapter._CHAT
    client = client_for(16)
    completion = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    request = endpoint.describe(client.chat.completions, {"model": "gpt-4o-mini", "messages": MESSAGES},
                                telemetry.settings)

    def block() -> float:
        ops = [telemetry.begin(request) for _ in range(COLLECT_EVERY)]
        for op in ops:
            endpoint.read(op, completion)
        start = _now()
        for op in ops:
            telemetry.finish(op)
        write_now(telemetry)
        return (_now() - start) / COLLECT_EVERY

    return statistics.median(block() for _ in range(repeat * 5))


def plain_call_ns(telemetry: Telemetry, repeat: int) -> float:
    """CPU ns our wrapper adds around a non-streaming create(): describe, span, hooks' work, read, finish."""
    client = client_for(16)
    completion = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    headers = httpx2.Headers(wire.openai_ratelimit_headers(500, 499, 9000, 8000))
    resource = client.chat.completions
    wrapper = sync_call(openai_adapter._CHAT)(telemetry)
    hook_wrapper = openai_adapter._HEADERS.base_client_targets("openai")[0].make(telemetry)

    def sdk_call(**kwargs: Any) -> Any:
        # what the SDK does between our create() wrapper and the response: our header hook runs in between
        hook_wrapper(lambda **_: None, None, (), {"response": httpx2.Response(200, headers=headers)})
        return completion

    def bare_call(**kwargs: Any) -> Any:
        httpx2.Response(200, headers=headers)
        return completion

    kwargs = {"model": "gpt-4o-mini", "messages": MESSAGES}

    def timed(call: Callable[[], Any], collect: Callable[[], None] = lambda: None) -> int:
        start = _now()
        for _ in range(COLLECT_EVERY):
            call()
        collect()
        return (_now() - start) // COLLECT_EVERY

    # medians, as for the finish that is taken from this figure to give a stream's request side
    on = statistics.median(timed(lambda: wrapper(sdk_call, resource, (), kwargs), lambda: write_now(telemetry))
                           for _ in range(repeat * 3))
    off = statistics.median(timed(lambda: bare_call(**kwargs)) for _ in range(repeat * 3))
    return on - off


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_growth(requests: int) -> tuple[int, int]:
    """RSS over ``requests`` streams as shipped: spans made after their calls by the writer thread, into a batch
    processor exporting (and dropping) them every 20 ms, so that its queue stays short at both readings."""
    client = client_for(16)
    tracer_provider = TracerProvider(sampler=ALWAYS_ON)
    tracer_provider.add_span_processor(BatchSpanProcessor(_DropSpans(), schedule_delay_millis=20))
    shipped = _telemetry.WRITE_BATCH, _telemetry.LATER_WAIT_S
    _telemetry.WRITE_BATCH, _telemetry.LATER_WAIT_S = COLLECT_EVERY, 1.0
    otel_llm.instrument(tracer_provider=tracer_provider,
                        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]))
    try:
        for _ in range(max(500, requests // 10)):
            run_sync_stream(client)
        gc.collect()
        before = rss_bytes()
        for _ in range(requests):
            run_sync_stream(client)
        gc.collect()
        return before, rss_bytes()
    finally:
        otel_llm.uninstrument()
        tracer_provider.shutdown()
        _telemetry.WRITE_BATCH, _telemetry.LATER_WAIT_S = shipped


def our_code_alone(settings: Settings, repeat: int) -> None:
    tracer_provider, meter_provider, _ = _pipeline()
    telemetry = Telemetry(tracer_provider.get_tracer("bench"), meter_provider.get_meter("bench"), settings)
    path = chunk_path_ns(_real_chunks(1024), telemetry, repeat) / 1e3
    unsampled = finish_ns(16, telemetry, repeat, gaps=False) / 1e3
    sampled = {n: finish_ns(n, telemetry, repeat, gaps=True) / 1e3 for n in (16, 256, 1024)}
    per_gap = (sampled[1024] - sampled[16]) / (1024 - 16)
    deferred = settings.chunk_gap_sample_rate * per_gap
    plain = plain_call_ns(telemetry, repeat) / 1e3
    print(f"chunk path (SDK -> caller): {path:+.2f} us per chunk")
    print(f"finish of a stream: {unsampled:.1f} us without gap records; with every gap recorded "
          + ", ".join(f"{n} chunks {us:.1f} us" for n, us in sampled.items()) + f" ({per_gap:.2f} us per gap)")
    print(f"per chunk in total: {path + deferred:+.2f} us (path {path:.2f} + gap records {per_gap:.2f} x sample "
          f"rate {settings.chunk_gap_sample_rate})")
    request_side = plain - plain_finish_ns(telemetry, repeat) / 1e3
    print(f"fixed per streamed request: {request_side + unsampled:+.1f} us (request side {request_side:.1f}, "
          f"as for a non-streamed call, + finish {unsampled:.1f})")
    print(f"non-streaming request: {plain:+.1f} us")
    tracer_provider.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--memory-requests", type=int, default=None)
    args = parser.parse_args(argv)
    if not sdk_enabled():
        parser.error("OTEL_SDK_DISABLED is set: otel_llm then instruments nothing, so there is nothing to measure")
    scale = 10 if args.quick else 1
    repeat = 5 if args.quick else 30
    # the writer thread's work is done on this thread at each collection, where it is timed (see the docstring)
    _telemetry.WRITE_BATCH = _telemetry.LATER_WAIT_S = None
    settings = load_settings()
    print(f"otel_llm overhead: openai {openai.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} cores, "
          f"chunk gap sample rate {settings.chunk_gap_sample_rate}; CPU time of the calling thread")

    print("\n1. end to end, side by side (uninstrumented and instrumented requests alternating)")
    print(f"{'workload':<20} {'off us/req':>11} {'on us/req':>11} {'+us/req':>9} {'moves':>8} {'+us/chunk':>10}")
    stream_16, plain_call = Workload("stream 16 chunks", 16, 2000 // scale), Workload("non-streaming", 0, 4000 // scale)
    # the fewest chunks with a chunk gap and a time per output token to record: a stream's fixed part, and two chunks
    stream_2 = Workload("stream 2 chunks", 2, 3000 // scale)
    shipped = {}
    for workload in (
        stream_2,
        stream_16,
        Workload("stream 256 chunks", 256, 300 // scale),
        Workload("stream 1024 chunks", 1024, 80 // scale),
        plain_call,
        Workload("async stream 256", 256, 300 // scale),
    ):
        off_us, on_us, delta, spread = side_by_side(workload)
        shipped[workload.name] = f"{delta:+.1f} ({spread:.1f})"
        per_chunk = f"{delta / workload.chunks:+.2f}" if workload.chunks else ""
        print(f"{workload.name:<20} {off_us:>11.1f} {on_us:>11.1f} {delta:>+9.1f} {spread:>8.1f} {per_chunk:>10}")

    print("\n2. our code alone, real SDK objects and pipeline")
    our_code_alone(settings, repeat)

    print("\n3. end to end by what a user can choose, measured as in 1: +us/req (moves)")
    print(f"{'configuration':<40} {stream_16.name:>18} {plain_call.name:>18}")
    print(f"{'as shipped (from 1)':<40} {shipped[stream_16.name]:>18} {shipped[plain_call.name]:>18}")
    for configuration in (
        Configuration("spans sampled out (ALWAYS_OFF)", sampled=False),
        Configuration(f"{STREAM_USAGE_ENV}=false", stream_usage=False),
        Configuration("both", sampled=False, stream_usage=False),
        Configuration("no usage asked, no chunk gaps recorded", stream_usage=False, chunk_gaps=False),
        Configuration("no chunk gaps recorded", chunk_gaps=False),
    ):
        _, _, delta, spread = side_by_side(stream_16, configuration)
        figures = [f"{delta:+.1f} ({spread:.1f})"]
        if configuration.stream_usage and configuration.chunk_gaps:  # else a non-streamed call is as shipped
            _, _, delta, spread = side_by_side(plain_call, configuration)
            figures.append(f"{delta:+.1f} ({spread:.1f})")
        else:
            figures.append("(streams only)")
        print(f"{configuration.name:<40} {figures[0]:>18} {figures[1]:>18}")

    print("\n4. the floor, measured as in 1 without otel_llm: the client inside one SDK span (five attributes); and\n"
          "   the least a conforming instrumentation records: that span with the response's attributes, and through\n"
          "   the SDK's Histogram.record() a non-streamed call's duration and token counts, a stream's duration and\n"
          "   time to first chunk (no usage asked, no chunk gaps: compare the fourth configuration of 3); what\n"
          "   asking for usage costs the client itself, its usage chunk hidden; and the least that records, asking\n"
          "   for usage, the token counts and time per output token too (no chunk gaps: the last configuration of 3)")
    print(f"{'workload':<56} {'off us/req':>11} {'on us/req':>11} {'+us/req':>9} {'moves':>8}")
    stream_floors = (("span, TTFT and 2 records, ", stream_floor), ("usage asked, nothing else, ", asked_usage),
                     ("span, TTFT and 5 records, usage asked, ", usage_floor))
    for name, floor_of, workload in (("span alone, ", span_floor, stream_16), ("span alone, ", span_floor, plain_call),
                                     ("span and 3 records, ", minimal_floor, plain_call),
                                     *((name, floor_of, workload) for workload in (stream_2, stream_16)
                                       for name, floor_of in stream_floors)):
        off_us, on_us, delta, spread = floor(workload, floor_of)
        print(f"{name + workload.name:<56} {off_us:>11.1f} {on_us:>11.1f} {delta:>+9.1f} {spread:>8.1f}")

    requests = args.memory_requests or (2_000 if args.quick else 20_000)
    before, after = memory_growth(requests)
    print(f"\nmemory: RSS {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB over {requests} streamed requests "
          f"({(after - before) / 2**20:+.2f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
