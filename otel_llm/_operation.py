"""The record of one logical operation: request facts, clock marks, usage and outcome, in plain values.

Provider adapters fill it in; the telemetry core turns it into one span and its metric points. Every clock mark is
``time.perf_counter_ns()``; ``start_ns`` is taken just before the SDK call that issues the request.
"""

from __future__ import annotations

import asyncio
import sys
from array import array
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from otel_llm._content import Message, Output, Part


@dataclass(slots=True)
class Request:
    """What is known before the call: set by the adapter, read by telemetry."""

    operation: str
    provider: str
    model: str | None
    server_address: str | None
    server_port: int | None
    stream: bool
    prompt_chars: int | None
    # further span attributes (request parameters), already semconv-named by the adapter via _semconv
    attributes: dict[str, Any] = field(default_factory=dict)
    # content in the conventions' shape (see _content), only when capture is on
    input_messages: list[Message] | None = None
    system_instructions: list[Part] | None = None
    # the client making the call (a stainless one): what an error says is redacted of its credentials
    client: Any = None
    # reads the request's JSON body as sent, for what the arguments could not tell before the call without being
    # used up (a prompt given as an iterator): once, when a response to it arrives (_stainless.read_sent)
    read_sent: Callable[[dict[str, Any]], None] | None = None


class _WeaklyReferable:
    __slots__ = ("__weakref__",)


@dataclass(slots=True)
class Operation(_WeaklyReferable):
    """One logical operation. It may be referred to weakly: what an adapter hangs on an SDK object must not keep an
    operation (span, gaps, captured content) alive after its stream is gone."""

    request: Request
    start_ns: int
    start_epoch_ns: int
    span: Any = None
    context: Any = None  # a Context holding the span: current during the SDK call, carried by metric records
    headers_ns: int = 0
    last_activity_ns: int = 0  # start, headers: what is known to have happened before any content
    # stream bookkeeping, O(1) per chunk (see _stream._sync_step): content chunk times and the gaps between them
    first_content_ns: int = 0
    last_content_ns: int = 0
    gaps_ns: array[int] | None = None
    record_gaps: bool = False  # this stream's gaps go to the chunk gap histogram (OTEL_LLM_CHUNK_GAP_SAMPLE_RATE)
    max_gap_ns: int = 0  # worked out at the finish
    # when a chunk told the response is complete (a final event, every choice finished): the caller stopping the
    # stream after it (break, close, with exit, dropping it) ends the operation there, without error
    done_ns: int = 0
    # the caller asked for no usage chunk; we did, so it must not reach the caller
    hide_usage_chunk: bool = False
    # and the counts on every chunk came only because we asked (vLLM's continuous_usage_stats, which the caller asked
    # for): taken off each
    hide_chunk_usage: bool = False
    # the adapter's way to take that chunk out before the client parses it, installed when the output finishes
    usage_lift: Any = None
    # response facts
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    reasoning_tokens: int | None = None
    reasoning_streamed: bool = False  # reasoning text came in the stream: its tokens are among those streamed
    # reasoning the stream did not show as text (a signature alone, a redacted block): its tokens are in the output
    # count, and unless reasoning_tokens says how many (converse never does), the answer's own count is unknown
    reasoning_hidden: bool = False
    # content chunks at the stream's start that summarize reasoning whose own tokens never stream (OpenAI's
    # reasoning summaries): the model reasons unseen after them, so the answer's time per token is timed from after
    summary_chunks: int = 0
    # gaps between content chunks (by index into gaps_ns) that the model spent waiting on a tool the service runs
    # itself (web search, code execution): no decoding in them, so they are out of the time per output token
    tool_waits: set[int] | None = None
    finished_choices: dict[int, str] | None = None  # of a stream's choices, those finished: index -> finish reason
    output: Output | None = None  # gathered only when content capture is on
    retries: int = 0
    retry_after: float | None = None
    # resource -> (remaining, limit); either may be unknown; and when the response that told them arrived
    rate_limits: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    rate_limits_ns: int = 0
    # further span attributes the response told (named via _semconv by the adapter), e.g. the provider's own latency
    attributes: dict[str, Any] = field(default_factory=dict)
    # proxies around it the caller may hold (a stream, a streaming response, a copy of either): the last one
    # dropped unfinished abandons it
    holders: int = 0
    # what the failed request authenticated with (found by the adapter on the error): redacted where an error
    # message quotes it, never written
    secrets: tuple[str, ...] = ()
    # outcome
    error_type: str | None = None
    end_ns: int = 0
    finished: bool = False
    # taken by its first write (spans that wait have their own claim, PendingSpan.claim): an operation handed to be
    # written a second time, by an interrupt's rescue (Telemetry.finish), is written once
    written: bool = False

    @property
    def content_chunks(self) -> int:
        return len(self.gaps_ns) + 1 if self.first_content_ns and self.gaps_ns is not None else 0

    def snapshot(self) -> Operation:
        """A copy for a write that comes later (see ``Telemetry.finish``): a caller may still read a closed stream,
        and what the adapter notes from those chunks must not reach the operation as it was closed."""
        copy = replace(self)
        copy.finish_reasons = list(self.finish_reasons)
        copy.rate_limits = dict(self.rate_limits)
        copy.attributes = dict(self.attributes)
        if self.tool_waits is not None:
            copy.tool_waits = set(self.tool_waits)
        if self.output is not None:
            copy.output = self.output.copy()
        return copy

    def waiting_on_a_tool(self) -> None:
        """A tool the service runs itself starts or ends here: the gap up to the next content chunk is its wait
        (before the first content chunk, a wait is part of the time to it)."""
        if self.first_content_ns and self.gaps_ns is not None:
            if self.tool_waits is None:
                self.tool_waits = set()
            self.tool_waits.add(len(self.gaps_ns))

    def last_activity(self) -> int:
        """When the operation was last seen doing something: where an abandoned stream ends."""
        return max(self.last_activity_ns, self.last_content_ns)

    def stopped_by_caller(self, now_ns: int, error_type: str) -> tuple[int, str | None]:
        """Where, and with what error type, an operation ends that the caller stopped before its end: a response
        already complete ends where it completed, without error; any other at ``now_ns`` with ``error_type``
        (cancelled, abandoned)."""
        if self.done_ns and self.last_content_ns <= self.done_ns:  # output after it: it was not complete
            return self.done_ns, None
        return now_ns, error_type

    def close(self, end_ns: int, error_type: str | None) -> bool:
        """Mark the operation finished; True only the first time, so every operation finishes exactly once. An error
        type the adapter named already (the service's error code behind a generic exception class) is kept."""
        if self.finished:
            return False
        self.finished = True
        self.end_ns = end_ns
        if self.gaps_ns is not None:
            # A closed stream may still hand out chunks it had decoded (close() in the caller's loop, or on another
            # thread): the stream's step leaves the operation alone once it is finished, and a gap it appends in
            # between goes into the stream's own array, not into this copy that is written and recorded.
            self.gaps_ns = self.gaps_ns[:]
            if self.gaps_ns:
                self.max_gap_ns = max(self.gaps_ns)
        if error_type is not None and self.error_type is None:
            self.error_type = error_type
        return True


def is_cancellation(error: BaseException) -> bool:
    """Whether the caller's async runtime cancelled what raised ``error``: asyncio's CancelledError, or trio's
    Cancelled (which is no subclass of it; httpx2 and anyio run on trio too). trio is looked for only where it is
    loaded."""
    if isinstance(error, asyncio.CancelledError):
        return True
    trio = sys.modules.get("trio")
    cancelled = getattr(trio, "Cancelled", None) if trio is not None else None
    return isinstance(cancelled, type) and isinstance(error, cancelled)
