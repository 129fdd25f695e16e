"""Proxies around what an SDK call hands back when the response is not complete yet.

A stream proxy notes chunk times and usage in O(1) per chunk and finishes its Operation exactly once: exhausted,
closed, ``with`` exit, error, cancellation, or garbage collected without any of those (``abandoned``). A response
proxy stands for a raw/streaming HTTP response whose ``parse()`` hands out the stream or the final object later.
They subclass wrapt's proxy so ``isinstance(proxy, openai.Stream)`` and every SDK attribute keep working.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import sys
import time
from array import array
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, SupportsIndex

import wrapt

from otel_llm import _semconv as sc
from otel_llm._operation import is_cancellation
from otel_llm._safety import report_failure

if TYPE_CHECKING:
    from otel_llm._operation import Operation
    from otel_llm._telemetry import Telemetry

# What an adapter says a chunk is: returned by Observe(operation, chunk), which also notes usage, ids and reasons
OTHER = 0  # no output in it (role-only, message_start, response.created, a finish or usage chunk, ...)
CONTENT = 1  # carries output: text, tool-call, reasoning or audio delta
HIDDEN = 2  # ours: a usage chunk we asked for and the caller did not, so the caller must not see it
# added to OTHER or CONTENT: the response is complete with this chunk (a final event, every choice finished), so a
# caller that stops reading here has not cancelled anything (see Operation.done_ns)
DONE = 4
Observe = Callable[["Operation", Any], int]
# (operation, exception) -> None: the adapter names an error the stream raised (error.type), before the finish
ReadError = Callable[["Operation", BaseException], None]
# (operation, parsed result) -> what the caller gets: the result, or a stream proxy around it
Adopt = Callable[["Operation", Any], Any]


# The I/O steps, one per way of waiting for a chunk. Each notes a chunk in its own body, O(1): a clock read and a
# gap entry per content chunk (counts and the longest gap are worked out at the finish); a function call per chunk
# would cost more than the lines it saves. They hold the operation, never the proxy, so a dropped stream is freed
# (and finalized) at once.


def _sync_step(next_chunk: Callable[[], Any], observe: Observe, read_error: ReadError, op: Operation,
               telemetry: Telemetry) -> Callable[[], Any]:
    finish, clock, gaps = telemetry.finish, time.perf_counter_ns, _gaps(op)

    def step() -> Any:
        while True:
            try:
                chunk = next_chunk()
            except StopIteration:
                finish(op, None, None, True)  # exhausted: no chunk can follow
                raise
            except BaseException as exc:
                _failed(op, exc, read_error, finish)
                raise
            try:
                kind = observe(op, chunk)
            except Exception:
                report_failure("stream chunk")
                return chunk
            if kind == CONTENT and not op.finished:  # a closed stream's leftovers are the caller's alone
                now = clock()
                if op.last_content_ns:
                    gaps.append(now - op.last_content_ns)
                else:
                    op.first_content_ns = now
                op.last_content_ns = now
                return chunk
            if kind != HIDDEN:
                if kind & DONE and not op.finished:
                    _done(op, kind, gaps)
                return chunk

    return step


def _async_step(next_chunk: Callable[[], Awaitable[Any]], observe: Observe, read_error: ReadError, op: Operation,
                telemetry: Telemetry) -> Callable[[], Awaitable[Any]]:
    finish, abandon, clock, gaps = telemetry.finish, telemetry.abandon, time.perf_counter_ns, _gaps(op)

    async def step() -> Any:
        while True:
            try:
                chunk = await next_chunk()
            except StopAsyncIteration:
                finish(op, None, None, True)  # exhausted: no chunk can follow
                raise
            except GeneratorExit:
                # this read was closed, not ended: its task destroyed while it waited (the garbage collector closes
                # the coroutine) or the coroutine closed by hand. Nobody reads on, so the stream is abandoned where
                # it was last seen active, not when the collector came by.
                abandon(op)
                raise
            except BaseException as exc:
                _failed(op, exc, read_error, finish)
                raise
            try:
                kind = observe(op, chunk)
            except Exception:
                report_failure("stream chunk")
                return chunk
            if kind == CONTENT and not op.finished:  # a closed stream's leftovers are the caller's alone
                now = clock()
                if op.last_content_ns:
                    gaps.append(now - op.last_content_ns)
                else:
                    op.first_content_ns = now
                op.last_content_ns = now
                return chunk
            if kind != HIDDEN:
                if kind & DONE and not op.finished:
                    _done(op, kind, gaps)
                return chunk

    return step


def _done(op: Operation, kind: int, gaps: array[int]) -> None:
    """The chunk that completes the response, with or without output in it: once per stream, off the path above."""
    now = time.perf_counter_ns()
    if kind & CONTENT:
        if op.last_content_ns:
            gaps.append(now - op.last_content_ns)
        else:
            op.first_content_ns = now
        op.last_content_ns = now
    op.done_ns = now


def _failed(op: Operation, exc: BaseException, read_error: ReadError,
            finish: Callable[[Operation, BaseException | str | None, int | None], None]) -> None:
    if _overlapping(exc):
        return
    if is_cancellation(exc):
        end_ns, error_type = op.stopped_by_caller(time.perf_counter_ns(), sc.ERROR_CANCELLED)
        if error_type is None:  # cancelled awaiting the tail of a complete response: nothing was cancelled
            finish(op, None, end_ns)
            return
    try:
        read_error(op, exc)
    except Exception:
        report_failure("stream error")
    finish(op, exc, None)


def _overlapping(exc: BaseException) -> bool:
    """The client's generator refusing a read while another read of it runs (two tasks or threads reading one
    stream): the caller's misuse, which ends nothing; the other read goes on with the stream."""
    message = str(exc) if type(exc) in (ValueError, RuntimeError) else ""
    return message == "generator already executing" or message.endswith("asynchronous generator is already running")


def _gaps(op: Operation) -> array[int]:
    if op.gaps_ns is None:
        op.gaps_ns = array("q")
    return op.gaps_ns


if TYPE_CHECKING:
    _ObjectProxy = wrapt.ObjectProxy[Any]
else:  # wrapt 1's proxy is generic in its stubs only
    _ObjectProxy = wrapt.ObjectProxy


class Transparent(_ObjectProxy):
    """A proxy of ours around a client's object that shows as that object where wrapt's would show itself: its repr,
    and pickling, which is the object's own (a client's stream and response refuse it with a TypeError, as their
    HTTP response holds locks; wrapt's proxy raises NotImplementedError)."""

    def __repr__(self) -> str:
        return repr(self.__wrapped__)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return self.__wrapped__.__reduce_ex__(protocol)

    def __reduce__(self) -> Any:
        return self.__wrapped__.__reduce__()


class _Holder(Transparent):
    """A proxy the caller holds while its operation goes on: the last one dropped unfinished abandons it. A copy
    (``copy.copy``) is the client's shallow copy, which shares the response and the chunks, in a proxy that shares
    the operation; a deep copy is the client's (it refuses one of a stream: the response holds locks)."""

    _self_shared: tuple[str, ...] = ()  # what a copy shares with the proxy it was made from

    def __init__(self, wrapped: Any, op: Operation, telemetry: Telemetry) -> None:
        super().__init__(wrapped)
        self._self_op = op
        self._self_telemetry = telemetry
        op.holders += 1
        telemetry.outlives(op)

    def __copy__(self) -> Any:
        wrapped = copy.copy(self.__wrapped__)  # first: what it raises is the client's, with no twin half made
        twin = type(self).__new__(type(self))
        wrapt.ObjectProxy.__init__(twin, wrapped)
        for name in ("_self_op", "_self_telemetry", *self._self_shared):
            setattr(twin, name, getattr(self, name))
        self._self_op.holders += 1
        return twin

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.__wrapped__, memo)

    def __del__(self) -> None:
        try:
            op = object.__getattribute__(self, "_self_op")
        except AttributeError:
            return  # half made (an interrupt in its __init__): it never held the operation
        try:
            op.holders -= 1
            if not op.holders and not op.finished:  # nobody finished it
                self._self_telemetry.abandon(op)
        except Exception:
            report_failure("finalizer")


class _StreamLifecycle(_Holder):
    """State and finish paths shared by the sync and async proxies; they differ only in the I/O step, which a copy
    shares. Per-chunk state lives in locals of closures: attribute access on a proxy costs more than on a plain
    object."""

    _self_shared = ("_self_next",)

    def _self_closed(self) -> None:
        """The consumer closed the stream; before its end, and before the response was complete, that is a
        cancellation."""
        op = self._self_op
        end_ns, error_type = op.stopped_by_caller(time.perf_counter_ns(), sc.ERROR_CANCELLED)
        self._self_telemetry.finish(op, error_type, end_ns)


class _SyncStream(_StreamLifecycle):
    def __init__(self, wrapped: Any, op: Operation, telemetry: Telemetry, observe: Observe,
                 read_error: ReadError) -> None:
        super().__init__(wrapped, op, telemetry)
        # the client's stream is its own iterator; another library's wrapper may only be iterable
        chunks = wrapped if hasattr(type(wrapped), "__next__") else iter(wrapped)
        self._self_next = _sync_step(chunks.__next__, observe, read_error, op, telemetry)

    def __iter__(self) -> Iterator[Any]:
        return _chunks(self, self._self_next)

    def close(self) -> None:
        self._self_closed()  # first: the close may end a read on another thread, which must not win the finish
        self.__wrapped__.close()


class StreamProxy(_SyncStream):
    """A stream that is its own iterator and a context manager, as the clients' streams are."""

    def __next__(self) -> Any:
        return self._self_next()

    def __enter__(self) -> StreamProxy:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class _IterableStreamProxy(_SyncStream):
    """A stream that is only iterable (botocore's EventStream): ``next()`` and ``with`` on it fail with a TypeError,
    as on the caller's object without us."""

    def __enter__(self) -> None:  # wrapt's would look the object's up: an AttributeError (__class__: the caller's)
        raise TypeError(f"{self.__class__.__name__!r} object does not support the context manager protocol")


def stream_proxy(wrapped: Any, op: Operation, telemetry: Telemetry, observe: Observe,
                 read_error: ReadError) -> _SyncStream:
    # the caller's class: wrapt's __class__ of an adapter's own proxy around it (Bedrock's step) is the stream's
    kind = wrapped.__class__
    proxy = StreamProxy if hasattr(kind, "__next__") or hasattr(kind, "__enter__") else _IterableStreamProxy
    return proxy(wrapped, op, telemetry, observe, read_error)


def _chunks(proxy: _SyncStream, step: Callable[[], Any]) -> Iterator[Any]:
    """What ``iter(stream)`` hands out: a generator of the stream's chunks, as the client's own ``__iter__`` is, so
    closing it closes only it. Its frame holds the proxy, which ``for chunk in ...create(stream=True)`` holds by no
    other reference: the stream is not abandoned while it is read."""
    while True:
        try:
            chunk = step()
        except StopIteration:
            return
        yield chunk


class _AsyncStream(_StreamLifecycle):
    def __init__(self, wrapped: Any, op: Operation, telemetry: Telemetry, observe: Observe,
                 read_error: ReadError) -> None:
        super().__init__(wrapped, op, telemetry)
        chunks = wrapped if hasattr(type(wrapped), "__anext__") else aiter(wrapped)  # as StreamProxy's
        self._self_next = _async_step(chunks.__anext__, observe, read_error, op, telemetry)

    def __aiter__(self) -> _AsyncChunks:
        return _AsyncChunks(self, self._self_next)


class AsyncStreamProxy(_AsyncStream):
    """An async stream that is its own async iterator and an async context manager, as the clients' streams are."""

    def __anext__(self) -> Awaitable[Any]:
        return self._self_next()

    async def __aenter__(self) -> AsyncStreamProxy:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        self._self_closed()
        await self.__wrapped__.close()


class _AsyncChunks:
    """What ``aiter(stream)`` hands out: the stream's chunks, each read by the proxy's step from a plain object
    (reading it off the proxy for every chunk costs ~0.14 us more, and an async generator of our own ~0.07 us). It
    holds the proxy, as _chunks does, and takes ``asend``, ``athrow`` and ``aclose`` as the client's own async
    generator does: closing or throwing ends it alone, and the stream stays open."""

    __slots__ = ("_next", "_proxy", "_step")

    def __init__(self, proxy: _AsyncStream, step: Callable[[], Awaitable[Any]]) -> None:
        self._proxy = proxy
        self._next = step
        self._step: Callable[[], Awaitable[Any]] = self._start  # then the proxy's step itself

    def _start(self) -> Awaitable[Any]:
        self._step = self._next
        return self._next()

    def __aiter__(self) -> _AsyncChunks:
        return self

    def __anext__(self) -> Awaitable[Any]:
        return self._step()

    def asend(self, value: Any) -> Awaitable[Any]:
        if value is not None and self._step is not self._next and self._step is not _no_more:
            return _refuse_before_start()
        return self._step()  # the client's generator ignores what it is sent

    async def athrow(self, typ: Any, val: Any = None, tb: TracebackType | None = None) -> None:
        """Raise the exception here and end this iterator (the stream stays open), as the client's generator does;
        one already closed returns."""
        if self._step is _no_more:
            return
        started, self._step = self._step is self._next, _no_more
        if isinstance(typ, BaseException):
            exc = typ
        elif isinstance(val, typ):
            exc = val
        else:
            exc = typ() if val is None else typ(val)
        if isinstance(exc, (StopAsyncIteration, StopIteration)):
            # raised in its frame, an async generator may not let these out (PEP 479); since Python 3.12 one not
            # started yet is not entered: StopAsyncIteration comes out as it is, StopIteration ends the awaitable
            if started or sys.version_info < (3, 12):
                raise RuntimeError(f"async generator raised {type(exc).__name__}") from exc
            if isinstance(exc, StopIteration):
                return
        raise exc.with_traceback(tb) if tb is not None else exc

    async def aclose(self) -> None:
        self._step = _no_more


async def _no_more() -> Any:
    raise StopAsyncIteration


async def _refuse_before_start() -> Any:
    raise TypeError("can't send non-None value to a just-started async generator")


class _AsyncClosingStreamProxy(AsyncStreamProxy):
    """For a stream that has ``aclose()`` too (openai's AsyncStream, an async generator another library hands us):
    that close is the caller's as well. Only there, so a stream without one does not seem to have it."""

    async def aclose(self) -> None:
        self._self_closed()
        await self.__wrapped__.aclose()


class _AsyncIterableStreamProxy(_AsyncStream):
    """A stream that is only async-iterable and closes synchronously (aiobotocore's AioEventStream): ``anext()`` and
    ``async with`` on it fail with a TypeError, as on the caller's object without us."""

    def close(self) -> None:
        self._self_closed()
        self.__wrapped__.close()

    def __aenter__(self) -> Coroutine[Any, Any, Any]:  # as _IterableStreamProxy's __enter__
        raise TypeError(f"{self.__class__.__name__!r} object does not support the asynchronous context manager "
                        "protocol")


def async_stream_proxy(wrapped: Any, op: Operation, telemetry: Telemetry, observe: Observe,
                       read_error: ReadError) -> _AsyncStream:
    kind = wrapped.__class__  # the caller's class, as in stream_proxy
    if not hasattr(kind, "__aenter__") and callable(close := getattr(kind, "close", None)) \
            and not inspect.iscoroutinefunction(close):
        return _AsyncIterableStreamProxy(wrapped, op, telemetry, observe, read_error)
    proxy = _AsyncClosingStreamProxy if hasattr(type(wrapped), "aclose") else AsyncStreamProxy
    return proxy(wrapped, op, telemetry, observe, read_error)


def closed_by_helper(raw_stream: object) -> None:
    """An SDK helper closed the HTTP response under a stream it wraps, bypassing the stream's own close()."""
    if isinstance(raw_stream, _StreamLifecycle):
        raw_stream._self_closed()


def helper_events(events: Iterator[Any], raw_stream: StreamProxy) -> Iterator[Any]:
    """An SDK helper's events made from a stream of ours: what the helper itself raises on what it read (its
    structured-output parser refusing an answer cut at the length limit) fails the operation, as the same refusal
    fails the call that does not stream. The caller's own code never runs in here; errors of the stream below were
    recorded where they arose, and the finish is once."""
    try:
        yield from events
    except Exception as exc:
        raw_stream._self_telemetry.finish(raw_stream._self_op, exc)
        raise


async def async_helper_events(events: AsyncIterator[Any], raw_stream: AsyncStreamProxy) -> AsyncIterator[Any]:
    """``helper_events`` for an async helper."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        raw_stream._self_telemetry.finish(raw_stream._self_op, exc)
        raise


class _ResponseLifecycle(_Holder):
    """A raw or streaming response whose body is parsed (into a stream, or the final object) or read by the caller
    itself (its HTTP response's body, watched: ``_Body``), and then closed or dropped. Closed or dropped before its
    body came to its end, it was cancelled or abandoned; after, it was complete."""

    _self_shared = ("_self_adopt", "_self_read_error", "_self_parsed")

    def __init__(self, wrapped: Any, op: Operation, telemetry: Telemetry, adopt: Adopt,
                 read_error: ReadError) -> None:
        super().__init__(wrapped, op, telemetry)
        self._self_adopt = adopt
        self._self_read_error = read_error
        self._self_parsed: tuple[Any, Any] | None = None
        _Body.watch(getattr(wrapped, "http_response", None), op)

    def _self_hand_out(self, parsed: Any) -> Any:
        # the SDK caches parse() results: hand out one proxy per parsed object too
        if self._self_parsed is not None and self._self_parsed[0] is parsed:
            return self._self_parsed[1]
        try:
            handed = self._self_adopt(self._self_op, parsed)
        except Exception:
            report_failure("parse")
            handed = parsed
        self._self_parsed = (parsed, handed)
        return handed

    def _self_parsed_to_callers_type(self, kwargs: dict[str, Any]) -> bool:
        """``parse(to=str)`` of a whole body: the caller's object is not ours to read; the client's own object of the
        same body is (``_self_read_own``). A stream of the caller's class (``to=MyStream``) is a stream all the
        same."""
        return kwargs.get("to") is not None and not self._self_op.request.stream

    def _self_read_own(self, own: Any) -> None:
        """The client's own object of a body the caller parsed to its own type or read itself (None: it has none),
        then the end."""
        if own is not None:
            self._self_hand_out(own)
        self._self_telemetry.finish(self._self_op, None, self._self_op.done_ns or None)

    def _self_read_by_hand(self) -> bool:
        """Whether the caller read a whole body that is no stream itself (``json()``, ``read()``, ``text()``) and
        parsed nothing: at its close, the client's own object of that body is ours to read (usage, ids)."""
        op = self._self_op
        return not op.finished and not op.request.stream and bool(op.done_ns) and self._self_parsed is None

    def _self_fail(self, exc: BaseException) -> None:
        try:
            self._self_read_error(self._self_op, exc)
        except Exception:
            report_failure("parse error")
        self._self_telemetry.finish(self._self_op, exc)

    def _self_released(self) -> None:
        handed = self._self_parsed[1] if self._self_parsed is not None else None
        if isinstance(handed, _StreamLifecycle):
            handed._self_closed()
        else:  # the body read by the caller itself, or not at all
            op = self._self_op
            end_ns, error_type = op.stopped_by_caller(time.perf_counter_ns(), sc.ERROR_CANCELLED)
            self._self_telemetry.finish(op, error_type, end_ns)


class _Body(Transparent):
    """The byte stream of a raw response's HTTP response (httpx's ``Response.stream``), which the client reads when
    it parses the body and the caller when it reads the body itself: each part is activity, and its end the
    response complete (``Operation.done_ns``). Iterated as the HTTP library iterates its own."""

    def __init__(self, wrapped: Any, op: Operation) -> None:
        super().__init__(wrapped)
        self._self_op = op

    @staticmethod
    def watch(http_response: Any, op: Operation) -> None:
        stream = getattr(http_response, "stream", None)
        if stream is not None and not isinstance(stream, _Body):
            try:
                http_response.stream = _Body(stream, op)
            except Exception:
                report_failure("response body")

    def __iter__(self) -> Iterator[bytes]:
        op, clock = self._self_op, time.perf_counter_ns
        for part in self.__wrapped__:
            op.last_activity_ns = clock()
            yield part
        op.done_ns = op.done_ns or clock()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        op, clock = self._self_op, time.perf_counter_ns
        parts = self.__wrapped__.__aiter__()
        try:
            async for part in parts:
                op.last_activity_ns = clock()
                yield part
            op.done_ns = op.done_ns or clock()
        finally:  # the HTTP library closes the generator it iterates; the one under it is ours to close
            if isinstance(parts, AsyncGenerator):
                await parts.aclose()


class ResponseProxy(_ResponseLifecycle):
    """A raw or streaming response whose ``parse()`` is synchronous."""

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        try:
            parsed = self.__wrapped__.parse(*args, **kwargs)
        except BaseException as exc:
            self._self_fail(exc)
            raise
        if not self._self_parsed_to_callers_type(kwargs):
            return self._self_hand_out(parsed)
        own = None
        if not self._self_op.finished:
            # a structured-output parser refusing the answer: not what the caller asked for
            with contextlib.suppress(Exception):
                own = self.__wrapped__.parse()
        self._self_read_own(own)
        return parsed


class _ClosingResponseProxy(ResponseProxy):
    """For a response that has ``close()`` (a streaming response; openai's raw response has none): only there, so a
    response without one does not seem to have it."""

    def close(self) -> None:
        if self._self_read_by_hand():
            own = None
            with contextlib.suppress(Exception):  # a structured-output parser refusing the answer: not ours to meet
                own = self.__wrapped__.parse()
            self._self_read_own(own)
        self._self_released()  # before the close, as a stream's close
        self.__wrapped__.close()


def response_proxy(wrapped: Any, op: Operation, telemetry: Telemetry, adopt: Adopt,
                   read_error: ReadError) -> ResponseProxy:
    proxy = _ClosingResponseProxy if hasattr(type(wrapped), "close") else ResponseProxy
    return proxy(wrapped, op, telemetry, adopt, read_error)


class AsyncResponseProxy(_ResponseLifecycle):
    """A streaming response of the async client: ``parse()`` and ``close()`` are coroutines."""

    async def parse(self, *args: Any, **kwargs: Any) -> Any:
        try:
            parsed = await self.__wrapped__.parse(*args, **kwargs)
        except BaseException as exc:
            self._self_fail(exc)
            raise
        if not self._self_parsed_to_callers_type(kwargs):
            return self._self_hand_out(parsed)
        own = None
        if not self._self_op.finished:
            with contextlib.suppress(Exception):  # as ResponseProxy's
                own = await self.__wrapped__.parse()
        self._self_read_own(own)
        return parsed

    async def close(self) -> None:
        if self._self_read_by_hand():
            own = None
            with contextlib.suppress(Exception):  # as ResponseProxy's
                own = await self.__wrapped__.parse()
            self._self_read_own(own)
        self._self_released()
        await self.__wrapped__.close()

