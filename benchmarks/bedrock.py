"""Overhead of otel_llm on Bedrock calls, boto3's and aiobotocore's, against the same clients uninstrumented.

    .venv-3.13/bin/python benchmarks/bedrock.py           # about a minute (a venv scripts/test makes with aiobotocore)
    .venv-3.13/bin/python benchmarks/bedrock.py --quick   # a smoke run (tests/test_aiobotocore.py runs it)

Real boto3 and aiobotocore clients sign, send and parse over a real loopback socket (tests/wire.py's server,
Bedrock's JSON and event-stream framing, no sleeps). As benchmarks/overhead.py does for openai, instrumentation
stays installed and uninstrumented and instrumented requests alternate one by one: an uninstrumented one calls the
client's own ``_make_api_call`` from under our patch (it still passes our response and retry hooks, which step aside
at once). The figure is the median of the paired differences in this thread's CPU time (the server's thread is not
counted), with how far that median moves within the run. Telemetry goes to a real SDK pipeline (a BatchSpanProcessor
dropping spans, an in-memory metric reader collecting every 32 requests, its work shared over them)."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiobotocore.client
import botocore.client
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import wire
import wire_bedrock as wb

import otel_llm
from otel_llm import _telemetry

CLAUDE = wb.FORMAT["claude-messages"]
MESSAGES = [{"role": "user", "content": [{"text": "Say hello"}]}]
COLLECT_EVERY = _telemetry.WRITE_BATCH


class _DropSpans(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _tokens(count: int) -> list[str]:
    return [f" t{index}" for index in range(count)]


# workload -> (the reply, the operation, its parameters, where the result's stream or body is)
Workload = tuple[wire.Reply, str, dict[str, Any], str | None]


def _workloads() -> dict[str, Workload]:
    def stream(count: int) -> Workload:
        events = wb.converse_stream(_tokens(count), usage=wb.Tokens(input=12, output=count))
        return wb.stream_reply(events), "ConverseStream", {"modelId": "m", "messages": MESSAGES}, "stream"

    return {
        "converse": (wb.converse_reply(wb.converse_body("Hello", usage=wb.Tokens(input=12, output=3), latency_ms=5)),
                     "Converse", {"modelId": "m", "messages": MESSAGES}, None),
        "converse_stream 16 tokens": stream(16),
        "converse_stream 256 tokens": stream(256),
        "invoke_model": (wb.invoke_reply(CLAUDE.body(_tokens(3), wb.Tokens(input=12, output=3))), "InvokeModel",
                         {"modelId": "m", "body": json.dumps(CLAUDE.request("Hi"))}, "body"),
    }


def _summary(pairs: list[tuple[int, int]]) -> tuple[float, float, float, float]:
    differences = [on - off for off, on in pairs]
    tenths = [statistics.median(differences[start::10]) for start in range(10)]
    return (statistics.median(off for off, _ in pairs) / 1e3, statistics.median(on for _, on in pairs) / 1e3,
            statistics.median(differences) / 1e3, (max(tenths) - min(tenths)) / 1e3)


def _blocks(count: int, pair: Callable[[int], tuple[int, int]], collect: Callable[[], int]) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    for start in range(0, count, COLLECT_EVERY):
        block = [pair(index) for index in range(start, min(count, start + COLLECT_EVERY))]
        share = collect() // len(block)
        found += [(off, on + share) for off, on in block]
    return found


def _collect(reader: InMemoryMetricReader) -> int:
    """What a collection of our batch costs (written on this thread, as the writer thread would), in CPU ns."""
    start = time.thread_time_ns()
    _telemetry.write_later(_telemetry._DEFERRED)
    reader.collect()
    return time.thread_time_ns() - start


def boto3_pairs(workload: Workload, count: int, reader: InMemoryMetricReader) -> list[tuple[int, int]]:
    reply, operation, params, key = workload
    own = vars(botocore.client.BaseClient)["_make_api_call"].__wrapped__
    with wire.LoopbackServer(lambda request: reply) as server:
        client = wb.client(server)

        def request(call: Callable[[str, dict[str, Any]], Any]) -> int:
            start = time.thread_time_ns()
            result = call(operation, params)
            if key == "stream":
                for _ in result[key]:
                    pass
            elif key == "body":
                result[key].read()
            return time.thread_time_ns() - start

        def pair(index: int) -> tuple[int, int]:
            def bare(name: str, api_params: dict[str, Any]) -> Any:
                return own(client, name, api_params)

            if index % 2:
                on = request(client._make_api_call)
                return request(bare), on
            off = request(bare)
            return off, request(client._make_api_call)

        _blocks(max(10, count // 10), pair, lambda: _collect(reader))
        return _blocks(count, pair, lambda: _collect(reader))


def aiobotocore_pairs(workload: Workload, count: int, reader: InMemoryMetricReader) -> list[tuple[int, int]]:
    reply, operation, params, key = workload
    own = vars(aiobotocore.client.AioBaseClient)["_make_api_call"].__wrapped__

    async def run() -> list[tuple[int, int]]:
        with wire.LoopbackServer(lambda request: reply) as server:
            async with get_session().create_client(
                    "bedrock-runtime", endpoint_url=wb.endpoint_url(server), region_name=wb.REGION,
                    aws_access_key_id="test", aws_secret_access_key="test",
                    config=AioConfig(retries={"total_max_attempts": 1, "mode": "standard"})) as client:

                async def request(call: Callable[[str, dict[str, Any]], Awaitable[Any]]) -> int:
                    start = time.thread_time_ns()
                    result = await call(operation, params)
                    if key == "stream":
                        async for _ in result[key]:
                            pass
                    elif key == "body":
                        await result[key].read()
                    return time.thread_time_ns() - start

                def bare(name: str, api_params: dict[str, Any]) -> Awaitable[Any]:
                    return own(client, name, api_params)  # type: ignore[no-any-return]

                async def block(start: int, end: int) -> list[tuple[int, int]]:
                    found = []
                    for index in range(start, end):
                        if index % 2:
                            on = await request(client._make_api_call)
                            found.append((await request(bare), on))
                        else:
                            off = await request(bare)
                            found.append((off, await request(client._make_api_call)))
                    return found

                async def blocks(count: int) -> list[tuple[int, int]]:
                    found: list[tuple[int, int]] = []
                    for start in range(0, count, COLLECT_EVERY):
                        pairs = await block(start, min(count, start + COLLECT_EVERY))
                        share = _collect(reader) // len(pairs)
                        found += [(off, on + share) for off, on in pairs]
                    return found

                await blocks(max(10, count // 10))
                return await blocks(count)

    return asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests, figures not to be read")
    args = parser.parse_args(argv)
    pairs = 20 if args.quick else 600
    # the writer thread's work is done on this thread at each collection, where it is timed (_collect)
    _telemetry.WRITE_BATCH = _telemetry.LATER_WAIT_S = None
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(_DropSpans(), max_queue_size=1 << 20))
    reader = InMemoryMetricReader()
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]))
    print(f"per request, {pairs} pairs each; CPU us of the calling thread: off, on, +median (its spread in the run)")
    try:
        for client, measure in (("boto3", boto3_pairs), ("aiobotocore", aiobotocore_pairs)):
            added = {}
            for name, workload in _workloads().items():
                off, on, delta, spread = _summary(measure(workload, pairs, reader))
                added[name] = delta
                print(f"{client:12} {name:27} {off:9.1f} {on:9.1f} {delta:+8.1f} ({spread:.1f})")
            per_token = (added["converse_stream 256 tokens"] - added["converse_stream 16 tokens"]) / 240
            print(f"{client:12} per further streamed token: {per_token:+.2f} us")
    finally:
        otel_llm.uninstrument()
        tracer_provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
