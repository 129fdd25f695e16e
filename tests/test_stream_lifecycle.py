"""Every stream finishes exactly once, on every path a caller can take, and the SDK's stream API keeps working."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import trio
import wire
from conftest import (
    API_KEY,
    Captured,
    Instrument,
    async_client,
    attributes,
    cancel_midway,
    openai_server,
    pickling_error,
    sync_client,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm import _semconv as sc
from otel_llm import _telemetry
from otel_llm._operation import Request
from otel_llm._settings import load_settings
from otel_llm._stream import CONTENT, AsyncStreamProxy
from otel_llm._telemetry import Telemetry

TOKENS = ["a", "b", "c", "d"]
USAGE = wire.Usage(input=5, output=4)
MESSAGES = [{"role": "user", "content": "hi"}]


def server(**timing: object) -> wire.ReplySource:
    return openai_server(tokens=TOKENS, usage=USAGE, **timing)




def test_exhausted_stream_finishes_without_error(otel: Captured) -> None:
    client, _ = sync_client(server())
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert isinstance(stream, openai.Stream)
    assert re.fullmatch(r"<openai\.Stream object at 0x[0-9a-f]+>", repr(stream))  # the client's own repr
    assert stream.response.status_code == 200
    assert len(list(stream)) == 6
    stream.close()  # closing after the end changes nothing
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.USAGE_OUTPUT_TOKENS] == 4


def test_break_then_close_is_cancelled(otel: Captured) -> None:
    client, _ = sync_client(server(delays=[0, 0, 0.01, 0.01, 0.01]))
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    for chunk in stream:
        if chunk.choices[0].delta.content == "b":
            break
    assert otel.spans() == []  # still open: the caller may come back to it
    stream.close()
    otel.assert_finished(sc.ERROR_CANCELLED)
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == 2
    # what was measured before the close is kept
    assert otel.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


def test_closing_an_iterator_of_the_stream_closes_only_the_iterator(otel: Captured) -> None:
    """iter(stream) is a generator of the stream's chunks, as the client's own is: closing it (contextlib.closing,
    the collector) leaves the stream open, and the caller reads on from the stream."""
    client, _ = sync_client(server())
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    chunks = iter(stream)
    assert isinstance(chunks, types.GeneratorType)
    next(chunks)
    chunks.close()
    assert otel.spans() == []
    assert len(list(stream)) == 5
    otel.assert_finished(None)


def test_a_stream_held_only_by_the_loop_reading_it_is_not_abandoned(otel: Captured) -> None:
    client, _ = sync_client(server())
    read = 0
    for _ in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
        gc.collect()
        read += 1
    assert read == 6
    otel.assert_finished(None)


@pytest.mark.parametrize("kind", ["stream", "raw response", "streaming response"])
def test_pickling_what_a_call_hands_back_fails_as_the_clients_own(instrument: Instrument, kind: str) -> None:
    """The client's stream and responses refuse pickling with a TypeError (their HTTP response holds locks), which a
    cache that falls back on TypeError relies on: with us they refuse it alike, not with wrapt's NotImplementedError."""
    def refusal() -> tuple[type[BaseException], str]:
        completions = sync_client(server())[0].chat.completions
        if kind == "stream":
            with completions.create(model="m", messages=MESSAGES, stream=True) as stream:
                return pickling_error(stream)
        if kind == "raw response":
            raw = completions.with_raw_response.create(model="m", messages=MESSAGES, stream=True)
            error = pickling_error(raw)
            raw.parse().close()
            return error
        with completions.with_streaming_response.create(model="m", messages=MESSAGES) as response:
            return pickling_error(response)

    without = refusal()
    assert without[0] is TypeError and "pickle" in without[1]
    otel = instrument()
    assert refusal() == without
    assert len(otel.spans()) == 1


@pytest.mark.parametrize("kept", ["copy", "original"])
def test_a_copy_of_a_stream_reads_on_in_the_same_operation(otel: Captured, kept: str) -> None:
    """copy.copy() is the client's shallow copy: the same response, the same chunks. What is read through either is
    one operation, not abandoned while either is held, finished once."""
    client, _ = sync_client(server())
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    read = [next(stream)]
    twin = copy.copy(stream)
    assert isinstance(twin, openai.Stream) and twin is not stream and twin.response is stream.response
    assert re.fullmatch(r"<openai\.Stream object at 0x[0-9a-f]+>", repr(twin))
    with pytest.raises(TypeError, match="pickle"):  # as the client's own stream: its response holds locks
        copy.deepcopy(stream)
    if kept == "copy":
        del stream
    else:
        del twin
        twin = stream
    gc.collect()
    assert otel.spans() == []
    read += list(twin)
    assert [chunk.choices[0].delta.content for chunk in read if chunk.choices][1:5] == TOKENS
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 4


def test_a_stream_and_its_copy_both_dropped_are_abandoned_once(otel: Captured) -> None:
    client, _ = sync_client(server(delays=[0, 0.02]))
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    next(stream)
    twin = copy.copy(stream)
    next(twin)  # the first token
    del stream
    gc.collect()
    otel.metrics()  # writes what was abandoned: nothing yet
    assert otel.spans() == []
    del twin
    gc.collect()
    otel.assert_abandoned_at_first_token()


def test_a_copy_of_a_streaming_response_parses_the_same_stream(otel: Captured) -> None:
    client, _ = sync_client(server())
    with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES, stream=True) as raw:
        twin = copy.copy(raw)
        assert isinstance(twin, openai.APIResponse) and twin is not raw
        assert len(list(twin.parse())) == 6
    otel.assert_finished(None)


@pytest.mark.parametrize("helper", [False, True], ids=["stream", "stream-helper"])
def test_a_close_from_another_thread_is_cancelled_however_the_read_there_ends(
        otel: Captured, monkeypatch: pytest.MonkeyPatch, helper: bool) -> None:
    """A watchdog or disconnect handler closes the stream another thread is reading: the caller stopped it, even
    when the read there has ended (failed, or run on to the end) by the time close() returns, as a busy process may
    order it. Over real sockets: the read is blocked in the socket when the close comes."""
    with wire.LoopbackServer(server(delays=[0, 0, 0.2, 0.2, 0.2])) as llm:
        client = openai.OpenAI(api_key=API_KEY, base_url=llm.base_url, max_retries=0)
        if helper:  # chat.completions.stream(): its close() closes the HTTP response itself
            stream: Any = client.chat.completions.stream(model="m", messages=MESSAGES).__enter__()
        else:
            stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        first = threading.Event()

        def read() -> None:
            with contextlib.suppress(Exception):  # the caller's own business
                for _ in stream:
                    first.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert first.wait(5)
        close = httpx2.Response.close

        def close_then_let_the_read_end(self: httpx2.Response) -> None:
            close(self)
            reader.join(5)

        monkeypatch.setattr(httpx2.Response, "close", close_then_let_the_read_end)
        stream.close()
    assert not reader.is_alive()
    otel.assert_finished(sc.ERROR_CANCELLED)


def test_chunks_read_after_a_close_reach_the_caller_and_not_the_record(otel: Captured) -> None:
    """close() inside the loop: the client still hands out what it had decoded; the operation ended at the close."""
    client, _ = sync_client(server())
    for _ in range(2):  # the first makes the metric series; the second's values wait for the collection
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        seen = []
        for chunk in stream:
            seen.append(chunk)
            if len(seen) == 3:  # role, "a", "b"
                stream.close()
        assert len(seen) > 3, "the client kept handing out chunks after the close"
        assert all(chunk.choices for chunk in seen)  # the usage chunk we asked for is still hidden
    assert [attributes(span)[sc.CONTENT_CHUNKS] for span in otel.spans()] == [2, 2]
    assert {attributes(span)[sc.ERROR_TYPE] for span in otel.spans()} == {sc.ERROR_CANCELLED}
    assert otel.point(sc.STABLE_NAMES.time_per_output_chunk.name).count == 2


def test_async_chunks_read_after_a_close_reach_the_caller_and_not_the_record(otel: Captured) -> None:
    client, _ = async_client(server())

    async def main() -> None:
        for _ in range(2):
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            seen = []
            async for chunk in stream:
                seen.append(chunk)
                if len(seen) == 3:
                    await stream.close()
            assert len(seen) > 3 and all(chunk.choices for chunk in seen)

    asyncio.run(main())
    assert [attributes(span)[sc.CONTENT_CHUNKS] for span in otel.spans()] == [2, 2]
    assert otel.point(sc.STABLE_NAMES.time_per_output_chunk.name).count == 2


def test_with_block_exit_closes_the_stream(otel: Captured) -> None:
    client, _ = sync_client(server())
    with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
        first = next(iter(stream))
        assert first.choices[0].delta.role == "assistant"
    assert stream.response.is_closed
    otel.assert_finished(sc.ERROR_CANCELLED)


def test_with_block_after_the_end_is_not_an_error(otel: Captured) -> None:
    client, _ = sync_client(server())
    with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
        chunks = list(stream)
    assert len(chunks) == 6
    otel.assert_finished(None)


def test_error_mid_stream_passes_through_and_is_recorded(otel: Captured) -> None:
    events = wire.chat_stream(TOKENS)
    client, _ = sync_client([wire.Reply.stream(events, drop_after=3)])
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    received = []
    with pytest.raises(openai.APIConnectionError) as raised:
        for chunk in stream:
            received.append(chunk)
    assert len(received) == 3
    otel.assert_finished("APIConnectionError")
    events_recorded = otel.span().events
    assert [e.name for e in events_recorded] == ["exception"]
    assert events_recorded[0].attributes["exception.type"] == "openai.APIConnectionError"  # type: ignore[index]
    assert raised.type is openai.APIConnectionError  # the SDK's own exception, unchanged


def test_server_error_event_mid_stream(otel: Captured) -> None:
    events = [*wire.chat_stream(TOKENS)[:2], wire.sse_error_event("overloaded")]
    client, _ = sync_client([wire.Reply.stream(events)])
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError, match="overloaded"):
        list(stream)
    otel.assert_finished("APIError")


def test_asyncio_cancellation_is_recorded_as_cancelled(otel: Captured) -> None:
    client, _ = async_client(server(delays=[0, 0, 5.0]))

    async def consume() -> None:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        async for _ in stream:
            pass

    cancel_midway(consume)
    otel.assert_finished(sc.ERROR_CANCELLED)
    assert otel.span().events == ()  # a cancellation is not an exception to report


def test_an_async_call_never_awaited_warns_as_without_us(instrument: Instrument) -> None:
    """The warning names the client's method, as uninstrumented, and nothing of ours ran."""
    def warned() -> tuple[list[str], str]:
        client, _ = async_client([])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            coroutine = client.chat.completions.create(model="m", messages=MESSAGES)
            name = coroutine.__qualname__
            del coroutine
            gc.collect()
        return sorted(str(warning.message) for warning in caught), name

    without = warned()
    otel = instrument()
    assert warned() == without == (["coroutine 'AsyncCompletions.create' was never awaited"], "AsyncCompletions.create")
    assert otel.spans() == []


@pytest.mark.parametrize("where", ["mid-stream", "before the headers", "after the response completed"])
def test_trio_cancellation_is_recorded_as_asyncios_is(otel: Captured, where: str) -> None:
    """trio's Cancelled is no asyncio.CancelledError, and the async clients run on trio too: a cancel scope that
    cancels the call is a cancellation all the same, and one that cancels only the wait for the stream's tail after
    the response completed has cancelled nothing. The caller's Cancelled passes through as trio raised it."""
    delays = {"mid-stream": [0, 0, 5.0], "before the headers": None, "after the response completed": None}[where]
    reply = server(delays=delays, headers_delay=5.0 if where == "before the headers" else 0.0)
    if where == "after the response completed":  # every choice finished; the usage chunk 5 s away
        events = wire.chat_stream(TOKENS, usage=USAGE)
        reply = [wire.Reply.stream(events, delays=[0] * (len(events) - 2) + [5.0])]
    client, _ = async_client(reply)
    caught: list[BaseException] = []

    async def consume() -> None:
        with trio.move_on_after(0.1) as scope:
            try:
                stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
                async for _ in stream:
                    pass
            except BaseException as exc:
                caught.append(exc)
                raise
        assert scope.cancelled_caught

    trio.run(consume)
    assert [type(exc) for exc in caught] == [trio.Cancelled]
    otel.assert_finished(None if where == "after the response completed" else sc.ERROR_CANCELLED)
    assert otel.span().events == ()  # a cancellation is not an exception to report


def test_a_call_whose_task_is_destroyed_while_it_waits_for_the_headers_is_abandoned(otel: Captured) -> None:
    """A task nobody holds any more, waiting on a server that never answers (a future nobody else holds): the
    garbage collector destroys it and closes the call's coroutine, from a context that is not the task's. The call is
    abandoned where it was last active, as a stream's read is, and nothing of ours is raised or logged there."""

    async def never_answer(request: Any) -> Any:
        await asyncio.get_running_loop().create_future()

    client = openai.AsyncOpenAI(api_key=API_KEY, max_retries=0,
                                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(never_answer)))

    async def main() -> None:
        async def call() -> None:
            await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)

        asyncio.get_running_loop().create_task(call())  # held by nobody
        for _ in range(3):
            await asyncio.sleep(0.02)
        gc.collect()

    unraisable: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        asyncio.run(main())
    finally:
        sys.unraisablehook = hook
    assert [type(item.exc_value) for item in unraisable] == []
    otel.metrics()  # written by the next collection, as what a finalizer ends is
    otel.assert_finished(sc.ERROR_ABANDONED)
    span = otel.span()
    assert span.events == ()
    assert span.end_time - span.start_time < 0.01e9  # type: ignore[operator]  # where it was last active: its start


def test_a_second_task_reading_a_stream_another_reads_is_refused_and_ends_nothing(otel: Captured) -> None:
    """The client's generator refuses a read while another is under way: the second reader gets the refusal as it
    would without us, and the stream, which the first reader goes on with, is not failed by it."""
    client, _ = async_client(server(delays=[0, 0, 0.05]))
    outcomes: list[str] = []

    async def read(stream: Any) -> None:
        try:
            async for _ in stream:
                pass
            outcomes.append("read to its end")
        except RuntimeError as exc:
            outcomes.append(str(exc))

    async def main() -> None:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        first = asyncio.create_task(read(stream))
        await asyncio.sleep(0.02)  # the first reader waits for a chunk
        await read(stream)
        await first

    asyncio.run(main())
    assert outcomes == ["anext(): asynchronous generator is already running", "read to its end"]
    otel.assert_finished(None)
    assert sc.RESPONSE_TIME_TO_FIRST_CHUNK in attributes(otel.span())


def test_abandoned_stream_finishes_when_collected(otel: Captured) -> None:
    client, _ = sync_client(server(delays=[0, 0.02]))
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    next(stream)
    next(stream)  # the first token
    del stream
    gc.collect()
    otel.assert_abandoned_at_first_token()


def test_an_abandoned_stream_is_written_by_the_next_operation_too(otel: Captured) -> None:
    client, _ = sync_client(server())
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    next(stream)
    del stream
    gc.collect()
    assert otel.spans() == []
    client.chat.completions.create(model="m", messages=MESSAGES)  # begins: first writes what waits
    assert [attributes(span).get(sc.ERROR_TYPE) for span in otel.spans()] == [sc.ERROR_ABANDONED, None]


def test_an_abandoned_stream_is_written_in_time_with_no_call_or_collection_to_come(
        otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service that makes no more calls and has no metric reader (tracing only) still gets the span soon."""
    monkeypatch.setattr(_telemetry, "LATER_WAIT_S", 0.05)
    _telemetry._later_wake.set()  # the writer thread takes the new wait at once
    client, _ = sync_client(server())
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    next(stream)
    del stream
    gc.collect()
    deadline = time.monotonic() + 5
    while not otel.exporter.get_finished_spans() and time.monotonic() < deadline:
        time.sleep(0.01)
    monkeypatch.setattr(_telemetry, "LATER_WAIT_S", None)
    _telemetry._later_wake.set()
    (span,) = otel.exporter.get_finished_spans()
    assert attributes(span)[sc.ERROR_TYPE] == sc.ERROR_ABANDONED


ABANDON = textwrap.dedent("""
    import gc, os, sys, threading, time
    import openai, wire
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    import otel_llm
    from otel_llm import _telemetry

    class Printing(SpanExporter):  # a synchronous exporter doing I/O: 50 ms of it
        def export(self, spans):
            time.sleep(0.05)
            for span in spans:
                print(os.getpid() == PARENT, span.attributes.get("error.type"), flush=True)
            return SpanExportResult.SUCCESS

    PARENT = os.getpid()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(Printing()))
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider())

    def abandon():
        http, _ = wire.mock_client([wire.Reply.stream(wire.chat_stream(["a", "b"]))])
        client = openai.OpenAI(api_key="k", http_client=http, max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                stream=True)
        next(stream)
        del stream
        gc.collect()
""")


def test_what_the_writer_thread_is_writing_at_exit_still_goes_out() -> None:
    program = ABANDON + textwrap.dedent("""
        _telemetry.LATER_WAIT_S = 0.01
        _telemetry._later_wake.set()
        abandon()
        while _telemetry._later_idle.is_set():  # until the writer thread is at it: 50 ms of export
            time.sleep(0.001)
        print("exiting", flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == f"True {sc.ERROR_ABANDONED}"


def test_a_forked_child_does_not_write_what_its_parent_left_waiting() -> None:
    program = ABANDON + textwrap.dedent("""
        _telemetry.LATER_WAIT_S = None
        abandon()
        child = os.fork()
        if child == 0:
            _telemetry.write_later()
            os._exit(0)
        os.waitpid(child, 0)
        _telemetry.write_later()
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", sc.ERROR_ABANDONED]  # once, by the parent


def test_a_forked_child_leaves_its_parents_streams_to_the_parent() -> None:
    """A stream under way at the fork is the parent's: the child's copy, read on, dropped or left at its exit, is
    no second span of the same call."""
    program = ABANDON + textwrap.dedent("""
        http, _ = wire.mock_client([wire.Reply.stream(wire.chat_stream(["a", "b", "c"]))])
        client = openai.OpenAI(api_key="k", http_client=http, max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                stream=True)
        next(stream)
        child = os.fork()
        if child == 0:
            if sys.argv[1] == "read on":
                list(stream)
            elif sys.argv[1] == "dropped":
                del stream
                gc.collect()
            sys.exit(0)  # the exit ends what is still held unfinished (Telemetry.finish_pending)
        os.waitpid(child, 0)
        list(stream)
    """)
    for child in ("read on", "dropped", "left at exit"):
        result = subprocess.run([sys.executable, "-c", program, child], capture_output=True, text=True, timeout=60,
                                cwd=Path(__file__).parent)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["True", "None"], child  # once, by the parent, as it ended there


BATCHED = textwrap.dedent("""
    import os, sys, threading
    import openai, wire
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    import otel_llm
    from otel_llm import _spans

    class Printing(SpanExporter):
        def export(self, spans):
            for span in spans:
                print(span.name, flush=True)
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Printing()))
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider())

    def call():
        http, _ = wire.mock_client([wire.Reply.json(wire.chat_completion_body("hi"))])
        openai.OpenAI(api_key="k", http_client=http, max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}])
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_writes_its_spans_though_the_writer_was_making_one_at_the_fork() -> None:
    """The writer thread holds the lock that makes spans one at a time while it writes: a child forked then must not
    inherit it held, or its first span (at the latest, at its exit) would wait for good."""
    program = BATCHED + textwrap.dedent("""
        holding, release = threading.Event(), threading.Event()

        def hold():
            with _spans._MAKING:
                holding.set()
                release.wait(5)

        threading.Thread(target=hold).start()
        holding.wait(5)
        child = os.fork()
        if child == 0:
            call()
            sys.exit(0)
        release.set()
        os.waitpid(child, 0)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["chat", "m"]  # the child's span: "chat m"


def writers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "otel_llm-writer"]


def wait_for_no_writer() -> None:
    deadline = time.monotonic() + 5
    while writers() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writers() == []


def test_uninstrument_leaves_no_thread_of_ours() -> None:
    otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    assert len(writers()) == 1
    otel_llm.uninstrument()
    wait_for_no_writer()


def test_a_pending_read_closed_by_the_garbage_collector_is_written_later() -> None:
    """A task destroyed while it awaited the next chunk: the collector closes its coroutine (GeneratorExit) at an
    allocation anywhere, maybe where this thread holds an SDK lock; the operation is written at the next
    collection, abandoned where it was last seen active."""
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(tracer_provider.get_tracer("t"), MeterProvider(metric_readers=[reader]).get_meter("t"),
                          load_settings())

    @types.coroutine
    def waiting() -> Any:
        yield

    class Chunks:
        reads = 0

        async def __anext__(self) -> str:
            self.reads += 1
            if self.reads == 1:
                await waiting()
            return "chunk"

    request = Request(operation="chat", provider="openai", model="m", server_address=None, server_port=None,
                      stream=True, prompt_chars=None)
    proxy = AsyncStreamProxy(Chunks(), telemetry.begin(request), telemetry, lambda op, chunk: CONTENT,
                             lambda op, error: None)
    pending = proxy.__anext__()
    pending.send(None)  # suspended in the read
    cycle: list[Any] = [pending]
    cycle.append(cycle)
    del pending, cycle
    gc.collect()
    assert exporter.get_finished_spans() == ()

    async def read_on() -> None:  # what the caller reads after the close is not the operation's
        for _ in range(3):
            assert await proxy.__anext__() == "chunk"

    asyncio.run(read_on())
    data = reader.get_metrics_data()  # the next collection
    assert [dict(span.attributes or {}).get(sc.ERROR_TYPE) for span in exporter.get_finished_spans()] == [
        sc.ERROR_ABANDONED]
    span = exporter.get_finished_spans()[0]
    assert dict(span.attributes or {})[sc.CONTENT_CHUNKS] == 0
    assert span.end_time == span.start_time  # nothing happened after the request went out
    assert span.events == ()  # no exception to report: the caller's task went away
    assert data is not None and any(metric.name == sc.STABLE_NAMES.duration.name
                                    for resource in data.resource_metrics for scope in resource.scope_metrics
                                    for metric in scope.metrics)


def test_a_read_whose_task_went_away_is_abandoned_where_the_stream_was_last_active(otel: Captured) -> None:
    """The real client's read, waiting on its socket for the next chunk, closed as the garbage collector closes the
    coroutine of a destroyed task: abandoned at the first token, not when the read was closed."""
    client, _ = async_client(server(delays=[0, 0, 5.0]))

    async def main() -> None:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        await stream.__anext__()  # the role chunk
        await stream.__anext__()  # the first token
        pending = stream.__anext__()
        pending.send(None)  # waiting on the socket: the next chunk is 5 s away
        await asyncio.sleep(0.05)
        pending.close()
        await stream.response.aclose()

    asyncio.run(main())
    otel.assert_abandoned_at_first_token()


def test_a_with_block_closed_by_the_garbage_collector_is_written_later(otel: Captured) -> None:
    """A generator of the caller's reading the stream in a ``with`` block, collected unfinished: the collector
    closes its frame (GeneratorExit), so the ``with`` exit runs on the collector's stack."""
    client, _ = sync_client(server())
    streams = []  # kept: only the caller's generator is garbage, so its with exit is what ends the stream

    def chunks() -> Any:
        with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
            streams.append(stream)
            yield from stream

    reading = chunks()
    next(reading)
    cycle: list[Any] = [reading]
    cycle.append(cycle)
    del reading, cycle
    gc.collect()
    assert otel.exporter.get_finished_spans() == ()  # nothing written on the collector's stack
    otel.metrics()  # the next collection writes it
    otel.assert_finished(sc.ERROR_CANCELLED)


@pytest.mark.parametrize("read", [0, 1, 3])
def test_a_stream_closed_by_the_garbage_collector_and_read_on_is_written_as_it_was_closed(
        otel: Captured, read: int) -> None:
    """Written later (at the next collection), while the caller went on reading what the client had decoded: what
    it reads after the close is not the operation's."""
    client, _ = sync_client(server())
    streams = []

    def chunks() -> Any:
        with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
            streams.append(stream)
            yield from stream

    reading = chunks()
    for _ in range(1 + read):  # the role chunk, then content
        next(reading)
    cycle: list[Any] = [reading]
    cycle.append(cycle)
    del reading, cycle
    gc.collect()
    rest = list(streams[0])
    assert rest and all(chunk.choices for chunk in rest)
    gaps = otel.points(sc.STABLE_NAMES.time_per_output_chunk.name)  # the collection that writes it
    otel.assert_finished(sc.ERROR_CANCELLED)
    span = otel.span()
    attrs = attributes(span)
    assert attrs[sc.CONTENT_CHUNKS] == read
    assert sum(point.count for point in gaps) == max(read - 1, 0)
    assert (sc.RESPONSE_TIME_TO_FIRST_CHUNK in attrs) == (read > 0)
    assert attrs.get(sc.RESPONSE_TIME_TO_FIRST_CHUNK, 0) <= (span.end_time - span.start_time) / 1e9
    assert (sc.MAX_CHUNK_GAP in attrs) == (read > 1)
    # nor what the chunks after it told: the finish reason and the usage came after the close
    assert sc.RESPONSE_FINISH_REASONS not in attrs and sc.USAGE_OUTPUT_TOKENS not in attrs


def test_calls_on_other_threads_are_written_while_a_collection_runs(otel: Captured) -> None:
    """Only the collector's own thread holds back: another may run while a finalizer waits on I/O."""
    client, _ = sync_client(server())
    started, release = threading.Event(), threading.Event()

    class SlowFinalizer:
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            started.set()
            release.wait(5)

    def collect() -> None:
        SlowFinalizer()
        gc.collect()

    collecting = threading.Thread(target=collect)
    collecting.start()
    try:
        assert started.wait(5)
        client.chat.completions.create(model="m", messages=MESSAGES)
        assert len(otel.spans()) == 1
    finally:
        release.set()
        collecting.join()


def test_a_stream_abandoned_before_exit_is_exported_at_exit() -> None:
    """Nothing collects metrics here and nothing calls again: the span still goes out before the tracer provider
    shuts down."""
    program = ABANDON + textwrap.dedent("""
        _telemetry.LATER_WAIT_S = None
        _telemetry._later_wake.set()
        abandon()
        print("exiting", flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["exiting", f"True {sc.ERROR_ABANDONED}"]


@pytest.mark.parametrize(("stop", "error_type"), [("at the finish", None), ("after the first token", "abandoned"),
                                                 ("by a crash", "abandoned")])
def test_a_stream_still_held_at_exit_is_finished_and_exported(stop: str, error_type: str | None) -> None:
    """A script that breaks out of its last stream, or dies reading it, still holds the stream at exit (a global,
    the traceback's frames): the interpreter's shutdown would free it too late to write anything, so the exit
    finishes it, as the garbage collector would have."""
    program = ABANDON + textwrap.dedent(f"""
        http, _ = wire.mock_client([wire.Reply.stream(wire.chat_stream(["a", "b"]))])
        client = openai.OpenAI(api_key="k", http_client=http, max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[{{"role": "user", "content": "hi"}}],
                                                stream=True)
        for chunk in stream:
            choice = chunk.choices[0]
            if {stop!r} == "at the finish" and choice.finish_reason:
                break
            if {stop!r} != "at the finish" and choice.delta.content:
                if {stop!r} == "by a crash":
                    raise RuntimeError("the application's own bug")
                break
        print("exiting", flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).parent)
    if stop == "by a crash":
        assert result.returncode == 1 and "RuntimeError: the application's own bug" in result.stderr
        assert result.stdout.splitlines() == [f"True {error_type}"]
    else:
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["exiting", f"True {error_type}"]


def test_a_stream_abandoned_as_the_interpreter_shuts_down_is_left_alone(
        otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    """At exit the providers are shut down already, and threads frozen mid-record may hold our locks."""
    client, _ = sync_client(server())
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    next(stream)
    monkeypatch.setattr(sys, "is_finalizing", lambda: True)
    del stream
    gc.collect()
    assert otel.spans() == []


def test_async_stream_exhausted_and_closed(otel: Captured) -> None:
    client, _ = async_client(server())

    async def main() -> int:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        assert isinstance(stream, openai.AsyncStream)
        async with stream as same:
            assert same is stream
            count = len([chunk async for chunk in stream])
        await stream.close()
        return count

    assert asyncio.run(main()) == 6
    otel.assert_finished(None)


@pytest.mark.parametrize("close", ["close", "aclose"])
def test_async_break_then_close(otel: Captured, close: str) -> None:
    """aclose() is openai's alias of close(), the one contextlib.aclosing() calls."""
    client, _ = async_client(server())

    async def main() -> None:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        async for _ in stream:
            break
        await getattr(stream, close)()

    asyncio.run(main())
    otel.assert_finished(sc.ERROR_CANCELLED)


def test_closing_an_async_iterator_of_the_stream_closes_only_the_iterator(otel: Captured) -> None:
    """aiter(stream) closes as the client's own async generator does: itself only; the caller reads on from the
    stream."""
    client, _ = async_client(server())

    async def main() -> tuple[list[Any], int]:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        chunks = aiter(stream)
        await anext(chunks)
        await chunks.aclose()
        after_close = [chunk async for chunk in chunks]
        return after_close, len([chunk async for chunk in stream])

    assert asyncio.run(main()) == ([], 5)
    otel.assert_finished(None)


def test_an_async_iterator_of_the_stream_takes_asend_and_athrow_as_the_clients_does(otel: Captured) -> None:
    """asend() steps it; athrow() raises there and ends that iterator only: the caller reads on from the stream."""
    client, _ = async_client(server())

    async def main() -> tuple[int, int, int]:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        chunks = aiter(stream)
        await chunks.asend(None)
        await chunks.asend(None)
        error = KeyError("caller's")
        with pytest.raises(KeyError) as raised:
            await chunks.athrow(error)
        assert raised.value is error
        await chunks.athrow(ValueError)  # ended: nothing more is raised
        return len([chunk async for chunk in chunks]), len([chunk async for chunk in stream]), len(otel.spans())

    assert asyncio.run(main()) == (0, 4, 1)
    otel.assert_finished(None)


def test_an_async_iterator_of_the_stream_refuses_what_the_clients_async_generator_refuses(
        instrument: Instrument) -> None:
    """A value sent before it started; StopAsyncIteration or StopIteration thrown in, before it started or after
    (PEP 479, and what Python 3.12 changed for a generator not started): the same outcome, with us or not."""
    def outcomes() -> list[str]:
        client, _ = async_client(server())

        async def attempt(send: bool, started: bool, thrown: type[BaseException]) -> str:
            chunks = aiter(await client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
            if started:
                await anext(chunks)
            try:
                await (chunks.asend("a value") if send else chunks.athrow(thrown))
            except Exception as error:
                return f"{type(error).__name__}: {error}"
            return "no error"

        async def main() -> list[str]:
            return [await attempt(send, started, thrown) for send in (True, False) for started in (False, True)
                    for thrown in (StopAsyncIteration, StopIteration)]

        return asyncio.run(main())

    without = outcomes()
    instrument()
    assert outcomes() == without
    assert without[:4] == ["TypeError: can't send non-None value to a just-started async generator"] * 2 + [
        "no error"] * 2


def test_an_async_stream_held_only_by_the_loop_reading_it_is_not_abandoned(otel: Captured) -> None:
    client, _ = async_client(server())

    async def main() -> int:
        read = 0
        async for _ in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            gc.collect()
            read += 1
        return read

    assert asyncio.run(main()) == 6
    otel.assert_finished(None)


def test_a_copy_of_an_async_stream_reads_on_in_the_same_operation(otel: Captured) -> None:
    client, _ = async_client(server())

    async def main() -> int:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        await anext(stream)
        twin = copy.copy(stream)
        assert isinstance(twin, openai.AsyncStream) and twin is not stream
        del stream
        gc.collect()
        assert otel.spans() == []
        return len([chunk async for chunk in twin])

    assert asyncio.run(main()) == 5
    otel.assert_finished(None)


def test_an_async_stream_without_aclose_does_not_seem_to_have_one(instrument: Any) -> None:
    import anthropic
    import wire_anthropic

    instrument()
    events = wire_anthropic.text_events(["a"], usage=wire_anthropic.Usage(input=3, output=1))
    http, _ = wire.mock_client([wire_anthropic.stream_reply(events)], async_=True)
    client = anthropic.AsyncAnthropic(api_key="sk-test", http_client=http, max_retries=0)

    async def main() -> bool:
        stream = await client.messages.create(model="claude", max_tokens=5, stream=True,
                                              messages=[{"role": "user", "content": "hi"}])
        await stream.close()
        return hasattr(stream, "aclose")

    assert asyncio.run(main()) is hasattr(anthropic.AsyncStream, "aclose") is False


def test_stream_helper_keeps_its_api_and_finishes_on_its_own_close(otel: Captured) -> None:
    client, recorder = sync_client(server())
    with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
        text = "".join(event.delta for event in stream if event.type == "content.delta")
        final = stream.get_final_completion()
    assert text == "abcd"
    assert final.choices[0].message.content == "abcd"
    assert final.usage is None  # as without otel_llm: the caller did not ask for usage
    assert recorder.requests[0].json["stream_options"] == {"include_usage": True}
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.USAGE_OUTPUT_TOKENS] == 4


def test_stream_helper_early_exit_finishes_at_once(otel: Captured) -> None:
    client, _ = sync_client(server())
    with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
        for event in stream:
            if event.type == "content.delta":
                break
        # the helper closes the HTTP response itself, not our stream: we must still hear of it right away
    otel.assert_finished(sc.ERROR_CANCELLED)


def test_async_stream_helper(otel: Captured) -> None:
    client, _ = async_client(server())

    async def main() -> str:
        async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
            final = await stream.get_final_completion()
        return final.choices[0].message.content or ""

    assert asyncio.run(main()) == "abcd"
    otel.assert_finished(None)


def test_async_stream_helper_early_exit(otel: Captured) -> None:
    client, _ = async_client(server())

    async def main() -> None:
        async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
            async for event in stream:
                if event.type == "content.delta":
                    break

    asyncio.run(main())
    otel.assert_finished(sc.ERROR_CANCELLED)
