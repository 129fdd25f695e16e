"""An interrupt (KeyboardInterrupt, or what a signal handler raises) can land anywhere in our code around a call.
The caller gets it; the call is still written once, as one span and one duration point together, and nothing of
ours is left behind (an operation held open, a span left current). Once a write has begun, an interrupt in it can
cost what it had not written yet, never a second write, and what the SDK's processors leave in the context there
(SimpleSpanProcessor's suppression of instrumentation, interrupted before its try) stays in the write's.

A sweep raises the interrupt at each entry into a function of ours, or into one ours calls (the SDK's, the
standard library's; in a write, into anything), one run per entry, as a signal handler's exception lands where the
interpreter enters a function or a generator goes on after a yield. Not in a finalizer of ours or a weak reference
callback: the interpreter swallows what those raise, the caller never sees it."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import contextvars
import dis
import functools
import gc
import logging
import os
import pathlib
import signal
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
import wire
import wire_anthropic as wa
import wire_bedrock as wb
from conftest import async_client, openai_server, sync_client
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm import _calls, _safety, _telemetry
from otel_llm import _semconv as sc

OURS = os.path.dirname(otel_llm.__file__)
MESSAGES = [{"role": "user", "content": "hi"}]
TOKENS = ["Hel", "lo", "!"]
# what runs as an object dies, on the garbage collector's stack or where the last reference went (and what it
# calls): finalizers and weak reference callbacks (a WeakSet's); what it raises never reaches the caller
FINALIZERS = {"__del__", "_note_collection", "_remove"}
RESUME = dis.opmap["RESUME"]
# a write once begun (Telemetry._write has claimed the operation: it is not written twice)
WRITING = {"_write_out", "_write_claimed"}
# what puts the context back after the call: like any cleanup, interrupted as it starts, it does not run
RESTORING = {"_leave", "_leave_closed", "Telemetry.deactivate", "detach"}


class Interrupt(BaseException):
    """What a signal handler raises in an asyncio program (for Ctrl-C, asyncio.run cancels the main task instead,
    and raises KeyboardInterrupt itself, once it is done)."""


class Timeout(Exception):
    """What an application's signal-based timeout raises: an Exception, which our own guards must not take for a
    failure of ours (_safety.report_failure)."""


class Sweep:
    """Counts the entries into our functions and those they call that a call makes (outside its writes, or inside
    them only), or at the n-th raises a signal whose handler raises ``raises``."""

    def __init__(self, in_writes: bool, at: int | None = None, raises: type[BaseException] = KeyboardInterrupt) -> None:
        self.in_writes, self.at, self.raises, self.entries, self.landed = in_writes, at, raises, 0, ""
        # in a write, an interrupt enters anything (the SDK's processors and exporters; a timeout there is theirs
        # to swallow)
        self._anything = in_writes and not issubclass(raises, Exception)
        self._writing = self._finalizing = 0  # frames of those open now

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event != "call":
            return None
        name = frame.f_code.co_name
        if name in FINALIZERS or name in WRITING:
            return self._enter(name in WRITING)
        if self._swept(frame):
            if self.entries == self.at:
                self.landed = frame.f_code.co_qualname
                sys.settrace(None)
                signal.raise_signal(signal.SIGUSR1)  # its handler runs at once, in this frame
            self.entries += 1
        return None

    def _enter(self, writing: bool) -> Callable[..., Any]:
        """A write or a finalizer begins: counted open until its frame returns (or raises)."""
        if writing:
            self._writing += 1
        else:
            self._finalizing += 1

        def left(frame: types.FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
            if event == "return":
                if writing:
                    self._writing -= 1
                else:
                    self._finalizing -= 1
            return left

        return left

    def _swept(self, frame: types.FrameType) -> bool:
        """An entry into our code or into what it calls, in the part of the call this sweep covers."""
        if self._finalizing or bool(self._writing) != self.in_writes or self._resumed(frame):
            return False
        caller = frame.f_back
        return self._anything or _ours(frame.f_code) or (caller is not None and _ours(caller.f_code))

    @staticmethod
    def _resumed(frame: types.FrameType) -> bool:
        """A generator's or coroutine's frame going on after ``yield from`` or ``await``, not entered: the
        interpreter takes no signal there (it does at a function's start and after a plain ``yield``: its RESUME
        instruction's argument says which)."""
        code, at = frame.f_code.co_code, frame.f_lasti
        return code[at] == RESUME and code[at + 1] & 3 >= 2


def _complete(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="m", messages=MESSAGES)


def _streamed(client: openai.OpenAI) -> None:
    for _ in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
        pass


def _closed_after_one_chunk(client: openai.OpenAI) -> None:
    with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as chunks:
        next(chunks)


def _after_a_stream_dropped(client: openai.OpenAI) -> None:
    """Two operations: a stream dropped after its first chunk, abandoned, and written by the call after it."""
    chunks = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    next(chunks)
    del chunks
    _complete(client)


def _raw_then_parsed(client: openai.OpenAI) -> None:
    client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES).parse()


def _rate_limited(client: openai.OpenAI) -> None:
    with contextlib.suppress(openai.RateLimitError):
        client.chat.completions.create(model="m", messages=MESSAGES, extra_headers={"x-reply": "429"})


def _async_complete(client: openai.AsyncOpenAI) -> None:
    asyncio.run(client.chat.completions.create(model="m", messages=MESSAGES))


def _async_streamed(client: openai.AsyncOpenAI) -> None:
    async def read() -> None:
        async for _ in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            pass

    asyncio.run(read())


def _anthropic_helper(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="claude-x", max_tokens=16, messages=MESSAGES) as stream:
        stream.get_final_message()


def _bedrock_streamed(client: Any) -> None:
    stream = client.converse_stream(modelId="amazon.nova-lite-v1:0", messages=[
        {"role": "user", "content": [{"text": "hi"}]}])["stream"]
    try:
        for _ in stream:
            pass
    finally:  # its connection: an interrupted read leaves it open
        stream.close()


def _openai_answer(request: wire.RecordedRequest) -> wire.Reply:
    if request.headers.get("x-reply") == "429":
        return wire.Reply.rate_limited()
    return openai_server(tokens=TOKENS, usage=wire.Usage(input=5, output=3))(request)


@contextlib.contextmanager
def _openai(is_async: bool) -> Iterator[tuple[Any, wire.Recorder]]:
    yield (async_client if is_async else sync_client)(_openai_answer)


@contextlib.contextmanager
def _anthropic(is_async: bool) -> Iterator[tuple[Any, wire.Recorder]]:
    def answer(request: wire.RecordedRequest) -> wire.Reply:
        return wa.stream_reply(wa.text_events(TOKENS, usage=wa.Usage(input=5, output=3)))

    http, recorder = wire.mock_client(answer)
    yield anthropic.Anthropic(api_key="sk-ant-test", http_client=http, max_retries=0), recorder


@contextlib.contextmanager
def _bedrock(is_async: bool) -> Iterator[tuple[Any, wire.LoopbackServer]]:
    def answer(request: wire.RecordedRequest) -> wire.Reply:
        return wb.stream_reply(wb.converse_stream(TOKENS, usage=wb.Tokens(input=5, output=3)))

    with wire.LoopbackServer(answer) as server:
        yield wb.client(server), server


@dataclass(frozen=True)
class Case:
    call: Callable[[Any], None]
    client: Callable[[bool], contextlib.AbstractContextManager[tuple[Any, Any]]]  # the client, what counts requests
    is_async: bool = False
    operations: int = 1  # the operations the call makes


CASES = {
    "complete": Case(_complete, _openai),
    "streamed": Case(_streamed, _openai),
    "closed after one chunk": Case(_closed_after_one_chunk, _openai),
    "after a stream dropped": Case(_after_a_stream_dropped, _openai, operations=2),
    "raw, then parsed": Case(_raw_then_parsed, _openai),
    "rate limited": Case(_rate_limited, _openai),
    "async complete": Case(_async_complete, _openai, is_async=True),
    "async streamed": Case(_async_streamed, _openai, is_async=True),
    "anthropic's stream helper": Case(_anthropic_helper, _anthropic),
    "bedrock's converse stream": Case(_bedrock_streamed, _bedrock),
}


@functools.cache
def _ours(code: types.CodeType) -> bool:
    return code.co_filename.startswith(OURS)


@pytest.fixture
def written(request: pytest.FixtureRequest) -> Iterator[Callable[[], tuple[int, int]]]:
    """Instrumented, under the span processor the test names (a batch one lets spans wait to be made:
    _spans.PendingSpan); yields what reads the spans and duration points written so far, once all that waits is
    written."""
    exporter = InMemorySpanExporter()
    processor = (BatchSpanProcessor if request.param == "batch" else SimpleSpanProcessor)(exporter)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(processor)
    reader = InMemoryMetricReader()
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]))

    def read() -> tuple[int, int]:
        if _held_open():
            gc.collect()  # a stream the interrupt left unfinished is abandoned
        _telemetry.write_all()
        processor.force_flush()
        data = reader.get_metrics_data()
        durations = [point.count for resource in (data.resource_metrics if data else ())
                     for scope in resource.scope_metrics for metric in scope.metrics
                     if metric.name == sc.STABLE_NAMES.duration.name for point in metric.data.data_points]
        return len(exporter.get_finished_spans()), sum(durations)

    yield read
    otel_llm.uninstrument()


def _runs_of(names: Iterable[str], timed_out: Iterable[str]) -> pytest.MarkDecorator:
    """(span processor, case, kind) per test: each case with an interrupt, those ``timed_out`` with a timeout, under
    either processor."""
    return pytest.mark.parametrize(("written", "name", "kind"), [
        (processor, name, kind) for processor in ("simple", "batch")
        for kind, names_of_kind in (("interrupt", names), ("timeout", timed_out)) for name in names_of_kind],
        indirect=["written"])


# a timeout through each adapter's guards (every guard is held to let it through: the structural test below)
TIMED_OUT = ["complete", "streamed", "anthropic's stream helper", "bedrock's converse stream"]


@_runs_of(CASES, TIMED_OUT)
def test_an_interrupt_anywhere_in_our_code_reaches_the_caller_and_the_call_is_written_once(
        name: str, kind: str, written: Callable[[], tuple[int, int]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A signal handler's KeyboardInterrupt (another BaseException in an asyncio program); or its timeout, an
    Exception, which reaches the caller through our own guards, never taken for a failure of ours."""
    case = CASES[name]
    for where, before, after in _sweep(case, _raised(kind, case, monkeypatch), in_writes=False, written=written):
        # each operation begun is written (whether its request reached the server or not), and once
        assert after.reached <= after.spans - before.spans == after.durations - before.durations <= case.operations, \
            where
        assert not _held_open(), where
        if where.landed not in RESTORING:
            assert after.current == ({}, None), where
        assert [record.getMessage() for record in caplog.records if record.name == "otel_llm"] == [], where


@_runs_of(["complete", "streamed", "after a stream dropped", "async streamed", "bedrock's converse stream"],
          ["complete", "streamed"])
def test_an_interrupt_in_a_write_costs_what_it_had_not_written_and_never_writes_twice(
        name: str, kind: str, written: Callable[[], tuple[int, int]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A write once begun is not begun again: where an interrupt lands in it, its span or its points may be lost.
    (A span ended again would have the SDK warn of it.) A timeout, as above, is not taken for a failure of ours."""
    operations = CASES[name].operations
    for where, before, after in _sweep(CASES[name], _raised(kind, CASES[name], monkeypatch), in_writes=True,
                                       written=written):
        assert after.spans - before.spans <= operations, where
        assert after.durations - before.durations <= operations, where
        assert not _held_open(), where
        assert after.current == ({}, None), where  # nothing the SDK's processors left in the write's context
        assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == [], where


def test_every_guard_of_ours_lets_what_a_signal_handler_raises_through() -> None:
    """Each ``except Exception`` of ours hands what it caught to ``report_failure`` or ``reraise_if_signalled``
    (which let a signal handler's exception go on to the caller: _safety), or raises: none swallows a timeout. The
    sweeps above go through the guards on their way; this covers those that only a failure reaches."""
    swallowing = []
    for path in sorted(pathlib.Path(OURS).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ExceptHandler) or node.type is None or "Exception" not in {
                    name.id for name in ast.walk(node.type) if isinstance(name, ast.Name)}:
                continue
            inside = [found for statement in node.body for found in ast.walk(statement)]
            called = {call.func.id for call in inside if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)}
            if not called & {"report_failure", "reraise_if_signalled"} and not any(
                    isinstance(found, ast.Raise) for found in inside):
                swallowing.append(f"{path.relative_to(OURS)}:{node.lineno}")
    assert swallowing == []


def _raised(kind: str, case: Case, monkeypatch: pytest.MonkeyPatch) -> type[BaseException]:
    """What the signal handler raises. With a timeout our own failures are logged and swallowed, not raised, as for
    a user (_safety.strict off): a timeout taken for one of ours would be swallowed too."""
    if kind == "timeout":
        monkeypatch.setattr(_safety, "strict", False)
        return Timeout
    return Interrupt if case.is_async else KeyboardInterrupt


@dataclass
class Landed:
    """Where the interrupt landed, for a failed assertion's message."""

    landed: str
    at: int
    entries: int

    def __str__(self) -> str:
        return f"interrupted entering {self.landed} (entry {self.at} of {self.entries})"


@dataclass
class Seen:
    """What was written so far (spans, duration points); what one run left current, requests that reached the
    server."""

    spans: int
    durations: int
    current: tuple[dict[str, object], object] = ({}, None)  # OpenTelemetry's context, our current operation
    reached: int = 0


def _sweep(case: Case, raises: type[BaseException], *, in_writes: bool,
           written: Callable[[], tuple[int, int]]) -> Iterator[tuple[Landed, Seen, Seen]]:
    """Runs the case's call once interrupted at each entry into our code, one run per entry: for each, where it
    landed, and what was written before and after. The signal's handler raises ``raises``."""
    unraisable: list[BaseException | None] = []
    before_hook, sys.unraisablehook = sys.unraisablehook, lambda report: unraisable.append(report.exc_value)
    try:
        yield from _runs(case, raises, in_writes, written)
        gc.collect()
    finally:
        sys.unraisablehook = before_hook
    # an interrupt in the client's own I/O leaves its connection to the garbage collector, as it does without us
    assert [error for error in unraisable if not (isinstance(error, ResourceWarning) and "unclosed <socket" in str(
        error))] == []


def _runs(case: Case, raises: type[BaseException], in_writes: bool,
          written: Callable[[], tuple[int, int]]) -> Iterator[tuple[Landed, Seen, Seen]]:
    with case.client(case.is_async) as (client, server):
        case.call(client)  # what the first call does once (a series made) is not in the calls after it
        written()
        counting = Sweep(in_writes, raises=raises)
        sys.settrace(counting)
        try:
            case.call(client)
            _telemetry.write_all()
        finally:
            sys.settrace(None)
        assert written() == (2 * case.operations, 2 * case.operations)
        assert counting.entries >= 10  # the sweep sees our code
        after = Seen(*written())
        for at in range(counting.entries):
            before, sent = after, len(server.requests)
            sweep = Sweep(in_writes, at, raises)
            current = contextvars.copy_context().run(_interrupted, case.call, client, sweep)
            after = Seen(*written(), current, len(server.requests) - sent)
            yield Landed(sweep.landed, at, counting.entries), before, after


def _held_open() -> bool:
    """Whether an operation of this round is held unfinished (a stream, a response read later)."""
    telemetry = _telemetry.live_telemetry()
    return telemetry is not None and bool(telemetry._pending)


def _interrupted(call: Callable[[Any], None], client: Any, sweep: Sweep) -> tuple[dict[str, object], object]:
    """Make the call under ``sweep``, which interrupts it; what it left current."""
    def handler(number: int, frame: types.FrameType | None) -> None:
        raise sweep.raises

    before = signal.signal(signal.SIGUSR1, handler)
    sys.settrace(sweep)
    try:
        call(client)
        _telemetry.write_all()  # what waits to be written (spans made when written: PendingSpan)
    except sweep.raises:
        pass
    else:
        pytest.fail(f"the caller did not get the {sweep.raises.__name__} raised at entry {sweep.at}: the call made "
                    f"{sweep.entries}")
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGUSR1, before)
    return dict(otel_context.get_current()), _calls.current_operation()
