"""The wrapper around one instrumented SDK call: describe the request, start the clock, call, hand back the result
(or a proxy around it). Provider adapters supply an ``Endpoint``; this module never looks inside SDK objects."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence, Set
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Protocol, cast

from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_llm._safety import report_failure
from otel_llm._stream import (
    AsyncResponseProxy,
    AsyncStreamProxy,
    StreamProxy,
    async_helper_events,
    async_stream_proxy,
    helper_events,
    response_proxy,
    stream_proxy,
)
from otel_llm._telemetry import live_telemetry

if TYPE_CHECKING:
    from types import CoroutineType

    from otel_llm._operation import Operation, Request
    from otel_llm._settings import Settings
    from otel_llm._telemetry import Telemetry

# wrapt's wrapper signature
Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

# the operation whose SDK call is running in this context, for hooks deeper in the client (headers, retries)
_current: ContextVar[Operation | None] = ContextVar("otel_llm_operation", default=None)


class Kind(enum.Enum):
    COMPLETE = "complete"  # the final object, or a raw response whose body is in: read it and finish
    STREAM = "stream"
    ASYNC_STREAM = "async_stream"
    RESPONSE = "response"  # a raw/streaming response whose parse()/close() come later
    ASYNC_RESPONSE = "async_response"


# the members _adopt() tells apart, read once: read off the enum class, each costs ~1k instructions (its metaclass
# keeps the interpreter's attribute cache out)
_COMPLETE, _STREAM, _ASYNC_STREAM, _RESPONSE, _ASYNC_RESPONSE = (
    Kind.COMPLETE, Kind.STREAM, Kind.ASYNC_STREAM, Kind.RESPONSE, Kind.ASYNC_RESPONSE)


class Endpoint(Protocol):
    """What a provider adapter knows about one SDK method. Plain values in, plain values out."""

    def describe(self, instance: Any, kwargs: dict[str, Any], settings: Settings) -> Request: ...

    def prepare(self, op: Operation, kwargs: dict[str, Any], settings: Settings) -> dict[str, Any]:
        """The kwargs to call with (a copy when changed, never the caller's dict mutated)."""
        ...

    def refused(self, op: Operation, error: Exception, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """If ``error`` is the server refusing what prepare() added: the caller's request to send instead, as the
        caller made it (``kwargs``); else None."""
        ...

    def kind(self, op: Operation, result: Any) -> Kind: ...

    def read(self, op: Operation, result: Any) -> None:
        """A Kind.COMPLETE result: the final object, or a raw response whose body is in."""
        ...

    def read_error(self, op: Operation, error: BaseException) -> None:
        """What an exception of the call, or of its stream, tells: headers of the response, a better error.type."""
        ...

    def observe(self, op: Operation, chunk: Any) -> int:
        """Note what a stream chunk tells (ids, reasons, usage); say what it is: _stream.OTHER/CONTENT/HIDDEN."""
        ...

    def gather(self, op: Operation, chunk: Any) -> None:
        """Add a stream chunk's content to ``op.output``; called only when content capture is on."""
        ...


def current_operation() -> Operation | None:
    return _current.get()


def sync_call(endpoint: Endpoint) -> Callable[[Telemetry], Wrapper]:
    def make(telemetry: Telemetry) -> Wrapper:
        def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            started = _begin(telemetry, endpoint, instance, kwargs)
            if started is None:
                return wrapped(*args, **kwargs)
            recording, op, call_kwargs = started
            try:  # around all of ours too: an interrupt (KeyboardInterrupt, a signal handler's) may land anywhere
                entered = _enter(recording, op)
                try:
                    result = _sync_send(wrapped, args, kwargs, call_kwargs, endpoint, op)
                finally:
                    _leave(recording, entered)
                return _adopt(recording, endpoint, op, result, is_async=False)
            except BaseException as exc:
                try:
                    _failed(recording, endpoint, op, exc)
                finally:
                    if not op.finished:  # an interrupt as _failed began
                        recording.finish(op, exc, sealed=True)
                raise

        return wrapper

    return make


def async_call(endpoint: Endpoint) -> Callable[[Telemetry], Wrapper]:
    def make(telemetry: Telemetry) -> Wrapper:
        def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            # everything happens when the coroutine runs: helpers create it early and await it later
            async def run() -> Any:
                started = _begin(telemetry, endpoint, instance, kwargs)
                if started is None:
                    return await wrapped(*args, **kwargs)
                recording, op, call_kwargs = started
                closed = False
                try:  # as in sync_call
                    entered = _enter(recording, op)
                    try:
                        result = await _async_send(wrapped, args, kwargs, call_kwargs, endpoint, op)
                    except GeneratorExit:
                        # closed, not ended: its task destroyed while the call waited (the garbage collector closes
                        # the coroutine, maybe from another context) or closed by hand. Nobody gets the result:
                        # abandoned where it was last seen active, as a stream's read closed so (_stream._async_step)
                        closed = True
                        recording.abandon(op)
                        raise
                    finally:
                        (_leave_closed if closed else _leave)(recording, entered)
                    return _adopt(recording, endpoint, op, result, is_async=True)
                except GeneratorExit:
                    raise
                except BaseException as exc:
                    try:
                        _failed(recording, endpoint, op, exc)
                    finally:
                        if not op.finished:  # as in sync_call
                            recording.finish(op, exc, sealed=True)
                    raise

            coroutine = run()
            try:
                return named_after(wrapped, coroutine)
            except BaseException:  # an interrupt: the caller never gets it to await, nor a warning that it did not
                coroutine.close()
                raise

        return wrapper

    return make


def named_after(wrapped: Callable[..., Any], coroutine: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
    """Our coroutine in place of the client's, under the client's own name, as a warning that it was never awaited
    says it."""
    name = getattr(wrapped, "__qualname__", None)
    if isinstance(name, str):
        named = cast("CoroutineType[Any, Any, Any]", coroutine)
        named.__qualname__, named.__name__ = name, name.rpartition(".")[2]
    return coroutine


def selected(make: Callable[[Telemetry], Wrapper],
             applies: Callable[[dict[str, Any]], bool]) -> Callable[[Telemetry], Wrapper]:
    """A call wrapper for the calls of a method that ``applies`` picks out by their arguments (one that calls a
    model only with some: a retrieve that streams); the others go through as if we were not there."""

    def make_selected(telemetry: Telemetry) -> Wrapper:
        wrapper = make(telemetry)

        def selective(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
            if applies(kwargs):
                return wrapper(wrapped, instance, args, kwargs)
            return wrapped(*args, **kwargs)

        return selective

    return make_selected


def hook(observe: Callable[[Operation, tuple[Any, ...], dict[str, Any]], None]) -> Callable[[Telemetry], Wrapper]:
    """A wrapper deeper in the client that only looks at its arguments (response headers, a retry) on behalf of the
    operation running in this context. Works for sync and async methods alike: it looks before the call."""

    def make(telemetry: Telemetry) -> Wrapper:
        def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            op = _current.get()
            if op is not None and not telemetry.retired:  # one kept under another library's wrapper: the new
                try:  # round's own hook sees it
                    observe(op, args, kwargs)
                except Exception:
                    report_failure("client hook")
            return wrapped(*args, **kwargs)

        return wrapper

    return make


def before(action: Callable[[Any], None]) -> Callable[[Telemetry], Wrapper]:
    """A wrapper that calls ``action(instance)`` before the wrapped method runs: for a close, the caller's outcome
    is recorded before the close can end a read on another thread."""

    def make(telemetry: Telemetry) -> Wrapper:
        def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            try:
                action(instance)
            except Exception:
                report_failure("close hook")
            return wrapped(*args, **kwargs)

        return wrapper

    return make


def helper_stream(raw_stream_of: Callable[[Any], object]) -> Callable[[Telemetry], Wrapper]:
    """Wraps an SDK helper's generator of events (sync or async) over the stream ``raw_stream_of(helper)``: over one
    of ours, an error the helper raises fails the operation (``helper_events``)."""

    def make(telemetry: Telemetry) -> Wrapper:
        def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            events = wrapped(*args, **kwargs)
            try:
                raw_stream = raw_stream_of(instance)
            except Exception:
                report_failure("stream helper")
                return events
            if isinstance(raw_stream, AsyncStreamProxy):
                return async_helper_events(events, raw_stream)
            if isinstance(raw_stream, StreamProxy):
                return helper_events(events, raw_stream)
            return events  # not a stream we measure

        return wrapper

    return make


def span_stand_in() -> Callable[[Telemetry], Wrapper]:
    """Wraps a client's own "start the span of this API call" function: while one of our operations runs in this
    context, the client gets a stand-in for our span (``Telemetry.stand_in``) instead of a span of its own. So the
    operation keeps one span, ours, and what the client does with its span (trace-context headers, making it current)
    points at ours."""

    def make(telemetry: Telemetry) -> Wrapper:
        def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            op = _current.get()
            if op is not None:
                try:
                    return telemetry.stand_in(op)
                except Exception:
                    report_failure("span stand-in")
            return wrapped(*args, **kwargs)

        return wrapper

    return make


def _begin(telemetry: Telemetry, endpoint: Endpoint, instance: Any,
           kwargs: dict[str, Any]) -> tuple[Telemetry, Operation, dict[str, Any]] | None:
    """The telemetry that records the call, the operation and the kwargs to call with; None to call as if we were
    not there: inside OpenTelemetry's ``suppress_instrumentation()``, while uninstrumented, or when describing the
    request failed. A wrapper of an earlier round, kept since (a bound method the application holds, the client's
    with_raw_response accessors), has the call recorded by the round running now; unless that round is recording
    it already (the old wrapper under another library's, under the new one)."""
    try:
        recording: Telemetry | None = telemetry
        if telemetry.retired:
            recording = live_telemetry() if _current.get() is None else None
        if recording is None or not is_instrumentation_enabled():
            return None
        op = recording.begin(endpoint.describe(instance, kwargs, recording.settings))
        return recording, op, endpoint.prepare(op, kwargs, recording.settings)
    except Exception:
        report_failure("request")
        return None


def _sync_send(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               call_kwargs: dict[str, Any], endpoint: Endpoint, op: Operation) -> Any:
    """The call with what prepare() made of it; if the server refuses what we added, the caller's own request."""
    try:
        return wrapped(*args, **call_kwargs)
    except Exception as exc:
        again = None if call_kwargs is kwargs else _refused(endpoint, op, exc, kwargs)
        if again is None:
            raise
    return wrapped(*args, **again)  # out of the except block: what it raises is not chained to the refusal


async def _async_send(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                      call_kwargs: dict[str, Any], endpoint: Endpoint, op: Operation) -> Any:
    try:
        return await wrapped(*args, **call_kwargs)
    except Exception as exc:
        again = None if call_kwargs is kwargs else _refused(endpoint, op, exc, kwargs)
        if again is None:
            raise
    return await wrapped(*args, **again)


def _refused(endpoint: Endpoint, op: Operation, error: Exception, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """What to send instead of a refused request; the operation's clock starts again with it, so TTFT and duration
    are the answered request's, not our refused one's (the span still covers both)."""
    try:
        again = endpoint.refused(op, error, kwargs)
    except Exception:
        report_failure("refusal")
        return None
    if again is not None:
        now = time.perf_counter_ns()
        op.start_epoch_ns += now - op.start_ns
        op.start_ns = op.last_activity_ns = now
        op.headers_ns = 0
    return again


def _enter(telemetry: Telemetry, op: Operation) -> tuple[object, Token[Operation | None]]:
    """Make the operation current for the SDK call, then start its clock: the last thing before the request."""
    entered = telemetry.activate(op), _current.set(op)
    op.start_ns = op.last_activity_ns = time.perf_counter_ns()
    return entered


def _leave(telemetry: Telemetry, entered: tuple[object, Token[Operation | None]]) -> None:
    _current.reset(entered[1])
    telemetry.deactivate(entered[0])


def _leave_closed(telemetry: Telemetry, entered: tuple[object, Token[Operation | None]]) -> None:
    """_leave() for a coroutine closed while its call ran: where it is closed from another context (the garbage
    collector's, its task gone), that context holds nothing of ours to leave."""
    try:
        _current.reset(entered[1])
    except ValueError:  # made in a context that is not the current one
        return
    telemetry.deactivate(entered[0])


def _failed(telemetry: Telemetry, endpoint: Endpoint, op: Operation, exc: BaseException) -> None:
    """The call raised, or an interrupt landed in our code around it (finished already where it landed late). The
    caller finishes the operation where an interrupt lands in here."""
    if op.finished:
        return
    try:
        endpoint.read_error(op, exc)
    except Exception:
        report_failure("error")
    telemetry.finish(op, exc, sealed=True)  # the caller got no result to read on


def _foreign_stream(result: Any, is_async: bool) -> Kind:
    """A streamed request's result that is not the client's stream: another library's wrapper around it (an
    instrumentation that wrapped the method before us, such as OpenTelemetry's openai-v2). One that iterates is
    proxied like the stream itself, so its chunks still pass through us and a usage chunk we asked for is still
    hidden (one that is only iterable too: we step its iterator). A final object (a model, a collection) is read
    as one."""
    kind = type(result)
    if is_async:
        if hasattr(kind, "__anext__") or (hasattr(kind, "__aiter__") and not _whole(kind)):
            return Kind.ASYNC_STREAM
    elif hasattr(kind, "__next__") or (hasattr(kind, "__iter__") and not _whole(kind)):
        return Kind.STREAM
    return Kind.COMPLETE


def _whole(kind: type) -> bool:
    """Iterable, yet a final object: a collection, or a model that iterates its fields (pydantic's, v2 or v1)."""
    return issubclass(kind, (Sequence, Mapping, Set)) or hasattr(kind, "model_fields") or hasattr(kind, "__fields__")


def _observer(endpoint: Endpoint, op: Operation) -> Callable[[Operation, Any], int]:
    """What a stream's chunks go through: with content capture on, the endpoint gathers each chunk's content as well.
    Chosen once per stream, so a stream without capture runs nothing for content."""
    if op.output is None:
        return endpoint.observe
    observe, gather = endpoint.observe, endpoint.gather

    def observe_and_gather(op: Operation, chunk: Any) -> int:
        kind = observe(op, chunk)
        if not op.finished:  # a closed stream's leftovers are the caller's alone
            try:
                gather(op, chunk)
            except Exception:
                report_failure("content")
        return kind

    return observe_and_gather


def _adopt(telemetry: Telemetry, endpoint: Endpoint, op: Operation, result: Any, *, is_async: bool) -> Any:
    """Hand the caller its result, wrapped when the operation is still under way. Never raises. A raw response's
    body parsed again once its operation is finished is the caller's alone: the operation may wait to be written."""
    if op.finished:
        return result
    try:
        kind = endpoint.kind(op, result)
        if kind is _COMPLETE and op.request.stream:
            kind = _foreign_stream(result, is_async)
        if kind is _STREAM:
            return stream_proxy(result, op, telemetry, _observer(endpoint, op), endpoint.read_error)
        if kind is _ASYNC_STREAM:
            return async_stream_proxy(result, op, telemetry, _observer(endpoint, op), endpoint.read_error)
        if kind is _RESPONSE or kind is _ASYNC_RESPONSE:  # made only here: most results are complete
            def adopt_parsed(op: Operation, parsed: Any) -> Any:
                return _adopt(telemetry, endpoint, op, parsed, is_async=is_async)

            if kind is _RESPONSE:
                return response_proxy(result, op, telemetry, adopt_parsed, endpoint.read_error)
            return AsyncResponseProxy(result, op, telemetry, adopt_parsed, endpoint.read_error)
        endpoint.read(op, result)
    except Exception:
        report_failure("response")
    # done_ns: a raw response's body came whole before it was parsed; sealed: parsed again, it is not read (above)
    telemetry.finish(op, None, op.done_ns or None, sealed=True)
    return result
