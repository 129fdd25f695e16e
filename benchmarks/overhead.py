"""Overhead of otel_llm against the uninstrumented openai client, side by side in one process.

    .venv/bin/python benchmarks/overhead.py            # full run, about two minutes
    .venv/bin/python benchmarks/overhead.py --quick    # a smoke run (the test suite runs this)

The real openai client reads real SSE bytes from its own in-process transport (no network, no sleeps), so the
client's own per-chunk work is the baseline. Rounds alternate uninstrumented and instrumented runs of the same
workload; figures are medians over rounds of this thread's CPU time (so other processes do not move them). Telemetry goes to a real SDK pipeline: a TracerProvider with a
BatchSpanProcessor (exporter dropping spans) and a MeterProvider whose reader is not collected during timing.

Printed figures:
- per request: median CPU time off / on and the difference;
- per chunk on the chunk path: the difference in time between the first and the last chunk reaching the caller,
  divided by the chunks in between (what the caller waits for while the stream runs);
- per chunk in total and fixed per streamed request: a least-squares line through (chunks, difference) over the
  16/256/1024-chunk workloads, which includes the recording at the finish;
- memory: RSS growth over N streamed requests after a warm-up, content capture off.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import openai
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import otel_llm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import wire  # noqa: E402  (the test suite's wire fakes: byte-exact OpenAI SSE)

MESSAGES = [{"role": "user", "content": "Write a haiku about latency."}]
# CPU time of this thread: what the client and we spend, unmoved by other processes on a shared 2-core machine
_now = time.thread_time_ns


class _DropSpans(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@dataclass
class Sample:
    total_ns: int
    chunk_path_ns: int  # first chunk -> last chunk reaching the caller


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


def run_sync_stream(client: openai.OpenAI) -> Sample:
    start = _now()
    first = last = 0
    for _chunk in client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True):
        last = _now()
        if not first:
            first = last
    return Sample(_now() - start, last - first)


def run_plain(client: openai.OpenAI) -> Sample:
    start = _now()
    client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    return Sample(_now() - start, 0)


async def run_async_stream(client: openai.AsyncOpenAI) -> Sample:
    start = _now()
    first = last = 0
    async for _chunk in await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True):
        last = _now()
        if not first:
            first = last
    return Sample(_now() - start, last - first)


@dataclass
class Workload:
    name: str
    chunks: int  # content chunks per response (0: not streamed)
    requests: int  # per round and mode
    is_async: bool = False


def measure(workload: Workload, rounds: int) -> tuple[list[Sample], list[Sample]]:
    events, plain = _body(max(workload.chunks, 1))
    off: list[Sample] = []
    on: list[Sample] = []
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(_DropSpans()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    if workload.is_async:
        aclient = openai.AsyncOpenAI(api_key="k", http_client=httpx2.AsyncClient(
            transport=httpx2.MockTransport(_async_handler(events, plain))))

        async def batch(n: int) -> list[Sample]:
            return [await run_async_stream(aclient) for _ in range(n)]

        def one_batch(n: int) -> list[Sample]:
            return asyncio.run(batch(n))
    else:
        client = openai.OpenAI(api_key="k", http_client=httpx2.Client(
            transport=httpx2.MockTransport(_handler(events, plain))))
        run = run_sync_stream if workload.chunks else run_plain

        def one_batch(n: int) -> list[Sample]:
            return [run(client) for _ in range(n)]

    one_batch(max(3, workload.requests // 4))  # warm caches and the client's pools
    for index in range(rounds):
        for instrumented in ((False, True) if index % 2 == 0 else (True, False)):
            if instrumented:
                otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
            gc.collect()
            samples = one_batch(workload.requests)
            if instrumented:
                otel_llm.uninstrument()
            (on if instrumented else off).extend(samples)
    tracer_provider.shutdown()
    return off, on


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_growth(requests: int) -> tuple[int, int]:
    events, plain = _body(16)
    client = openai.OpenAI(api_key="k", http_client=httpx2.Client(
        transport=httpx2.MockTransport(_handler(events, plain))))
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(_DropSpans()))
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--memory-requests", type=int, default=None)
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 8)
    scale = 10 if args.quick else 1
    workloads = [
        Workload("stream 16 chunks", 16, 200 // scale),
        Workload("stream 256 chunks", 256, 30 // scale or 3),
        Workload("stream 1024 chunks", 1024, 10 // scale or 2),
        Workload("non-streaming", 0, 300 // scale),
        Workload("async stream 256", 256, 30 // scale or 3, is_async=True),
    ]
    rate = os.environ.get("OTEL_LLM_CHUNK_GAP_SAMPLE_RATE", "0.25 (default)")
    print(f"otel_llm overhead, openai {openai.__version__}, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cores, chunk gap sample rate {rate}, {rounds} rounds")
    print(f"{'workload':<20} {'off us/req':>11} {'on us/req':>11} {'+us/req':>9} {'+us/chunk path':>15}")
    deltas: dict[int, float] = {}
    for workload in workloads:
        off, on = measure(workload, rounds)
        off_us = statistics.median(s.total_ns for s in off) / 1e3
        on_us = statistics.median(s.total_ns for s in on) / 1e3
        path = ""
        if workload.chunks > 1:
            between = workload.chunks + 1  # role chunk and finish chunk are chunks too
            path_off = statistics.median(s.chunk_path_ns for s in off) / 1e3
            path_on = statistics.median(s.chunk_path_ns for s in on) / 1e3
            path = f"{(path_on - path_off) / between:+.2f}"
            if not workload.is_async:
                deltas[workload.chunks] = on_us - off_us
        print(f"{workload.name:<20} {off_us:>11.1f} {on_us:>11.1f} {on_us - off_us:>+9.1f} {path:>15}")
    xs = sorted(deltas)
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(deltas[x] for x in xs)
    slope = sum((x - mean_x) * (deltas[x] - mean_y) for x in xs) / sum((x - mean_x) ** 2 for x in xs)
    print(f"per chunk in total (incl. recording at the finish): {slope:+.2f} us; "
          f"fixed per streamed request: {mean_y - slope * mean_x:+.1f} us")
    requests = args.memory_requests or (2_000 if args.quick else 20_000)
    before, after = memory_growth(requests)
    print(f"memory: RSS {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB over {requests} streamed requests "
          f"({(after - before) / 2**20:+.2f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
