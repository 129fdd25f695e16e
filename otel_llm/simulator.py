"""A built-in LLM server on loopback: the OpenAI chat-completions, Anthropic Messages and Bedrock Claude wires, a
serving-engine latency model, ground truth.

Use it to watch otel_llm work without an API key, and to compare what a client measured with what the server did::

    with Simulator(seed=1) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="sim")
        claude = anthropic.Anthropic(base_url=sim.endpoint_url, api_key="sim")
        bedrock = boto3.client("bedrock-runtime", endpoint_url=sim.endpoint_url, region_name="us-east-1",
                               aws_access_key_id="sim", aws_secret_access_key="sim")
        ...
        print(summarize(sim.truth()).ttft.p99)

Wire. ``POST /v1/chat/completions`` answers plain JSON (with ``usage``) or, with ``"stream": true``, server-sent
events: a role-only chunk (``content: ""``), one chunk per output token, a chunk carrying ``finish_reason``, a
usage-only chunk with ``choices: []`` when ``stream_options.include_usage`` is true, then ``data: [DONE]``.
``GET /v1/models`` lists the served models. HTTP/1.1 with keep-alive and chunked transfer encoding, served by an
asyncio event loop in one daemon thread. Unknown models get 404 ``model_not_found``; with ``api_key`` set, a wrong
bearer token gets 401 ``invalid_api_key``.

Anthropic Messages API: ``POST /v1/messages`` takes the Messages body (``model``, ``messages``, required
``max_tokens``, optional ``system``). With ``"stream": true`` the answer is server-sent events with ``event:`` lines,
as the API writes them: ``message_start`` (``usage.input_tokens``, placeholder ``output_tokens: 1``),
``content_block_start``, ``ping``, one ``content_block_delta`` (``text_delta``) per output token,
``content_block_stop``, ``message_delta`` with ``stop_reason`` and ``usage.output_tokens``, ``message_stop``.
Otherwise a Message with ``usage``. Every answer carries ``request-id`` and, for ``requests`` and ``tokens``,
``anthropic-ratelimit-*-limit``, ``-remaining`` and ``-reset`` (the RFC 3339 time the bucket is full again).
Errors have the API's typed body: ``invalid_request_error`` (400), ``not_found_error`` (404, unknown model),
``rate_limit_error`` (429, with ``retry-after``); with ``api_key`` set, a wrong key gets 401
``authentication_error`` (the key comes as ``x-api-key`` or, as anthropic 2.x sends it, a bearer
``authorization``), otherwise any key is accepted. ``anthropic-version`` is not checked; ``overloaded_error``
is never sent.

Bedrock runtime: ``POST /model/{modelId}/invoke`` and ``/model/{modelId}/invoke-with-response-stream`` take the
Anthropic Claude messages body (``anthropic_version`` ``"bedrock-2023-05-31"``, ``messages``, required
``max_tokens``, optional ``system``), the model id being one of the served models. The stream is AWS event-stream
``chunk`` messages, each holding one Claude stream event's JSON in base64: ``message_start`` and
``content_block_start``, one ``content_block_delta`` per output token, ``content_block_stop``, ``message_delta``
with ``stop_reason`` and output tokens, and ``message_stop`` carrying ``amazon-bedrock-invocationMetrics`` (token
counts; ``firstByteLatency`` and ``invocationLatency`` in whole ms from the truth marks). The plain answer is a
Claude message with the ``x-amzn-bedrock-*-token-count`` and ``-invocation-latency`` headers. Errors come as
Bedrock's (``x-amzn-ErrorType``): ``ValidationException`` for a bad body or unknown model, ``ThrottlingException``
(429) when a rate limit is hit. Requests are not authenticated: any SigV4 signature is accepted.

Latency model (every parameter is a field of `EngineConfig`):

- The engine has ``capacity`` slots. A request holds one from the start of its prefill to its last token; requests
  beyond capacity wait first come, first served. That wait is the queue wait.
- With ``n`` slots busy, each step runs ``slowdown(n) = 1 + batch_slowdown * (n - 1)`` times slower than alone:
  the batch shares one accelerator, so throughput rises with concurrency while every sequence slows down.
- Prefill takes ``(prefill_base_s + prefill_per_token_s * prompt_tokens) * slowdown(n)``, ``n`` counted when it
  starts. With probability ``tail_probability`` it is also multiplied by ``tail_prefill_multiplier`` (the heavy
  tail: p99 TTFT sits well above p50). TTFT = queue wait + prefill.
- Token ``i + 1`` is due ``tpot_base_s * slowdown(n)`` after token ``i`` was due, ``n`` counted at token ``i``,
  so time per output token follows the batch as it changes. Deadlines are absolute: timer lateness (about 1 ms
  on epoll) does not accumulate.
- Prompt tokens = ceil(characters of message and system text / ``chars_per_token``). Output tokens = the request's
  ``max_completion_tokens`` or ``max_tokens`` (``finish_reason`` ``"length"``; above ``max_output_tokens`` is a
  400), else a log-normal draw with median ``output_tokens_median`` and shape ``output_tokens_sigma``, clipped to
  ``[1, max_output_tokens]`` (``finish_reason`` ``"stop"``). Claude requires ``max_tokens``, so on the Messages API
  and Bedrock it caps the draw instead (``stop_reason`` ``"max_tokens"`` when it cut the draw short, else
  ``"end_turn"``).
- Rate limits: token buckets holding ``requests_per_minute`` and ``tokens_per_minute`` (``None`` disables one),
  full at start and refilled continuously. A request costs 1 request and prompt + output tokens; when a bucket
  lacks that, the answer is 429 with ``retry-after`` (whole seconds, rounded up) and the wire's own error. On the
  OpenAI wire that is an OpenAI-style error body and ``retry-after-ms``, and every answer to a chat request carries
  ``x-ratelimit-limit-*``, ``x-ratelimit-remaining-*`` and ``x-ratelimit-reset-*`` for ``requests`` and ``tokens``
  (reset = time until the bucket is full again); the Messages API spells them its own way (above).
- Response headers and the role-only chunk (Claude streams: ``message_start``, ``content_block_start`` and, on the
  Messages API, ``ping``) go out as soon as a request is admitted, before it queues, so a client that takes them
  for its first token measures visibly less than the true TTFT.

Randomness: the k-th chat request to arrive (k counts from 0) draws everything (heavy tail, output length, text,
completion id) from ``random.Random(f"{seed}/{k}")``; the same seed and arrival order give the same draws.

Ground truth: each chat request on any wire answered 200, 429 or 499 (client went away mid-response) leaves a
`TruthRecord` with `time.perf_counter_ns` marks, the clock an in-process client uses: arrival of the request head,
each content chunk just before it goes to the socket, the end of the response. `summarize` gives exact percentiles
by nearest rank (`Quantiles`), the values a histogram quantile is to be compared with. A client in the same process
shares the GIL with the server thread: its TTFT runs from before the request is sent to after the chunk is parsed,
so it exceeds the truth by the client's own work (openai 3.x: about 1-1.6 ms to build a request) plus a few tenths
of a millisecond of transfer, more when either thread waits for the other. A client that keeps the CPU busy also
makes the server's timers fire late: records stay exact, but latencies then exceed the model's nominal values.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import datetime
import json
import math
import random
import socket
import threading
import time
import urllib.parse
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from itertools import pairwise
from types import TracebackType
from typing import Any, Protocol

from otel_llm import _eventstream

__all__ = [
    "DEFAULT_MODEL",
    "EngineConfig",
    "Quantiles",
    "Simulator",
    "TruthRecord",
    "TruthSummary",
    "percentile",
    "summarize",
]

DEFAULT_MODEL = "otel-llm-sim"

_HOST = "127.0.0.1"
_FINGERPRINT = "fp_otelllmsim"
_RATE_LIMIT_DOCS = "Visit https://platform.openai.com/account/rate-limits to learn more."
_BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"
# Bedrock pads each event with a random-length "p" string so sizes do not give the content away; a fixed one here
_PADDING = b"abcdefghijklmnopqrstuvwxyzABCDEF"

_WORDS = """
the a of to and in is that for it as with on be by this are from at or an which model we can not have more time
data one all their will has its but also into each when than other two these new first been such only most used
system any may were some what over our how latency token request server stream batch cache queue output
input prompt slot engine kernel memory throughput decode prefill trace span metric signal sample window rate
budget client network answer question result value measure percentile tail median load user service call reply
because while before after under between without within across during through against about around every
quickly slowly steady careful simple small large long short fast slow early late clear exact common useful
"""
# Leading-space words like a BPE vocabulary, plus punctuation; each entry's JSON string is built once.
_TOKEN_TEXTS = (*(" " + word for word in _WORDS.split()), *(",",) * 12, *(".",) * 10, *("\n\n",) * 2)
_TOKENS = tuple((text, json.dumps(text).encode()) for text in _TOKEN_TEXTS)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Parameters of the latency model described in the module docstring. Times in seconds.

    The defaults make one request at concurrency 1 take about 0.3 s (48 tokens at 6 ms after a ~20 ms prefill) and
    saturate at 32 sequences, so a demo at concurrencies 1/4/16/64 runs in seconds.
    """

    capacity: int = 32
    prefill_base_s: float = 0.015
    prefill_per_token_s: float = 0.00004
    tpot_base_s: float = 0.006
    batch_slowdown: float = 0.04
    output_tokens_median: int = 48
    output_tokens_sigma: float = 0.6
    max_output_tokens: int = 4096
    tail_probability: float = 0.02
    tail_prefill_multiplier: float = 15.0
    chars_per_token: float = 4.0
    requests_per_minute: int | None = 10_000
    tokens_per_minute: int | None = 2_000_000

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.output_tokens_median < 1 or self.max_output_tokens < 1:
            raise ValueError("capacity, output_tokens_median and max_output_tokens must be at least 1")
        if min(self.prefill_base_s, self.prefill_per_token_s, self.tpot_base_s, self.batch_slowdown) < 0:
            raise ValueError("times and batch_slowdown must not be negative")
        if not 0 <= self.tail_probability <= 1 or self.tail_prefill_multiplier < 1 or self.chars_per_token <= 0:
            raise ValueError("need 0 <= tail_probability <= 1, tail_prefill_multiplier >= 1, chars_per_token > 0")
        if any(limit is not None and limit < 1 for limit in (self.requests_per_minute, self.tokens_per_minute)):
            raise ValueError("rate limits must be at least 1, or None")

    def slowdown(self, busy: int) -> float:
        """How many times slower a step runs with `busy` slots in use than alone."""
        return 1 + self.batch_slowdown * max(busy - 1, 0)


@dataclass(frozen=True, slots=True)
class TruthRecord:
    """What the simulator did for one chat request. Times are `time.perf_counter_ns` values."""

    index: int  # arrival order; selects the request's random draws
    request_id: str  # the chat completion or Claude message id sent to the client
    model: str
    stream: bool
    status: int  # 200, 429, or 499 when the client went away mid-response
    received_ns: int  # the request head had arrived
    queue_wait_ns: int  # admitted -> got a decode slot
    token_ns: tuple[int, ...]  # each content chunk, just before it was written (streams only)
    finished_ns: int  # the end of the response was about to be written
    prompt_tokens: int
    output_tokens: int  # tokens sent (fewer than planned on 499)
    slow: bool  # drew the heavy-tail prefill

    @property
    def first_token_ns(self) -> int | None:
        return self.token_ns[0] if self.token_ns else None

    @property
    def ttft_s(self) -> float | None:
        """Arrival -> first content chunk written."""
        return (self.token_ns[0] - self.received_ns) / 1e9 if self.token_ns else None

    @property
    def tpot_s(self) -> float | None:
        """(last content chunk - first) / (chunks - 1), for streams with at least two content chunks."""
        if len(self.token_ns) < 2:
            return None
        return (self.token_ns[-1] - self.token_ns[0]) / (len(self.token_ns) - 1) / 1e9

    @property
    def gaps_s(self) -> list[float]:
        """Gap before each content chunk after the first."""
        return [(later - earlier) / 1e9 for earlier, later in pairwise(self.token_ns)]


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of values, interpolating linearly between the two nearest ranks.

    This is Hyndman & Fan's type 7, numpy's default: rank h = (n - 1) * q / 100 over the sorted values.
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within [0, 100], got {q}")
    return _sorted_percentile(ordered, q)


def _sorted_percentile(ordered: Sequence[float], q: float) -> float:
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Exact percentiles of a sample by nearest rank: the q-th is the ceil(q * n)-th smallest value. NaN when the
    sample is empty.

    Prometheus's ``histogram_quantile(q)`` looks for the first bucket whose cumulative count reaches q * n, which is
    the bucket holding that same value, and interpolates inside it: so a histogram's quantile and this one lie in one
    bucket, whatever the sample's size. Interpolating between ranks (`percentile`) does not: of 16 requests with one
    slow, its p95 lies a quarter of the way from the 15th to the slowest, far below the bucket a histogram answers
    from."""

    count: int
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Quantiles:
        ordered = sorted(values)
        if not ordered:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(len(ordered), *(ordered[max(0, math.ceil(len(ordered) * q / 100) - 1)] for q in (50, 95, 99)))


@dataclass(frozen=True, slots=True)
class TruthSummary:
    """Aggregates over truth records. Latencies in seconds, from streamed requests answered 200."""

    requests: int
    ok: int
    rate_limited: int
    output_tokens: int  # sent with status 200
    elapsed_s: float  # first arrival -> last response finished
    requests_per_s: float  # answered 200, per elapsed second
    output_tokens_per_s: float
    ttft: Quantiles
    tpot: Quantiles
    chunk_gap: Quantiles
    queue_wait: Quantiles


def summarize(records: Sequence[TruthRecord]) -> TruthSummary:
    """Throughput and exact TTFT/TPOT/chunk-gap/queue-wait percentiles of `records`."""
    ok = [record for record in records if record.status == 200]
    streamed = [record for record in ok if record.token_ns]
    elapsed_ns = max(r.finished_ns for r in records) - min(r.received_ns for r in records) if records else 0
    elapsed_s = elapsed_ns / 1e9
    output_tokens = sum(record.output_tokens for record in ok)
    return TruthSummary(
        requests=len(records),
        ok=len(ok),
        rate_limited=sum(record.status == 429 for record in records),
        output_tokens=output_tokens,
        elapsed_s=elapsed_s,
        requests_per_s=len(ok) / elapsed_s if elapsed_s else math.nan,
        output_tokens_per_s=output_tokens / elapsed_s if elapsed_s else math.nan,
        ttft=Quantiles.of(ttft for r in streamed if (ttft := r.ttft_s) is not None),
        tpot=Quantiles.of(tpot for r in streamed if (tpot := r.tpot_s) is not None),
        chunk_gap=Quantiles.of(gap for r in streamed for gap in r.gaps_s),
        queue_wait=Quantiles.of(r.queue_wait_ns / 1e9 for r in ok),
    )


class Simulator:
    """The simulated LLM server (OpenAI, Anthropic and Bedrock wires); see the module docstring. Runs once: start,
    then stop.

    `seed` fixes the random draws, `port` 0 picks a free port, `models` are the model ids it serves, and `api_key`,
    when set, is the only key accepted (a bearer token; ``/v1/messages`` also takes it as ``x-api-key``).
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        seed: int = 0,
        port: int = 0,
        models: Sequence[str] = (DEFAULT_MODEL,),
        api_key: str | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.seed = seed
        self.models = tuple(models)
        self._requested_port = port
        self._api_key = api_key
        self._slots = _Slots(self.config.capacity)
        self._limits = _RateLimits(self.config)
        self._next_index = 0
        self._records: list[TruthRecord] = []
        self._connections: set[asyncio.Task[Any]] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._port: int | None = None
        self._ran = False

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the simulator is not running; call start() or use it as a context manager")
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI client's ``base_url``."""
        return f"{self.endpoint_url}/v1"

    @property
    def endpoint_url(self) -> str:
        """The server's root: the Anthropic client's ``base_url``, boto3's ``endpoint_url`` for the Bedrock routes."""
        return f"http://{_HOST}:{self.port}"

    def start(self) -> Simulator:
        """Bind and serve from a daemon thread; returns once the port accepts connections."""
        if self._ran:
            raise RuntimeError("a Simulator runs once; create a new one")
        self._ran = True
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="otel-llm-simulator", daemon=True)
        self._thread.start()
        try:
            self._port = ready.result()
        except (OSError, RuntimeError):
            self._thread.join()
            raise
        return self

    def stop(self) -> None:
        """Close the listener, cut open connections and join the thread. Safe to call twice."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._loop is not None and self._stopping is not None and thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        thread.join()
        self._port = None

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def truth(self) -> list[TruthRecord]:
        """Records of the chat requests answered so far, in arrival order."""
        return sorted(self._records, key=lambda record: record.index)

    def reset_truth(self) -> None:
        """Forget the records (the draw sequence and rate-limit buckets carry on)."""
        self._records.clear()

    def _run(self, ready: concurrent.futures.Future[int]) -> None:
        try:
            asyncio.run(self._serve(ready))
        finally:
            if not ready.done():
                ready.set_exception(RuntimeError("the simulator thread ended before it served"))

    async def _serve(self, ready: concurrent.futures.Future[int]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            server = await asyncio.start_server(self._connection, _HOST, self._requested_port)
        except OSError as exc:
            ready.set_exception(exc)
            return
        ready.set_result(server.sockets[0].getsockname()[1])
        await self._stopping.wait()
        server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while await self._exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass  # stop(): end normally, as Python 3.11's stream callback logs a cancelled connection task
        finally:
            self._connections.discard(task)
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; False when the connection should close."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
            return False  # clean end of a keep-alive connection
        except asyncio.LimitOverrunError:
            await _send_json(writer, 431, _error("Request headers too large.", "invalid_request_error"), [], False)
            return False
        received_ns = time.perf_counter_ns()
        try:
            method, path, headers = _parse_head(head)
            length = int(headers.get("content-length", "0"))
            if length < 0:
                raise ValueError(length)
        except ValueError:
            await _send_json(writer, 400, _error("Malformed HTTP request.", "invalid_request_error"), [], False)
            return False
        if "transfer-encoding" in headers:
            await _send_json(writer, 411, _error("Send a Content-Length body.", "invalid_request_error"), [], False)
            return False
        body = await reader.readexactly(length)
        keep_alive = headers.get("connection", "").lower() != "close"
        request = _Request(body, received_ns, keep_alive)

        bedrock = _bedrock_route(path) if method == "POST" else None
        messages_api = (method, path) == ("POST", "/v1/messages")
        bearer = headers.get("authorization")
        if messages_api and "x-api-key" in headers:  # the Messages API's own header; anthropic 2.x sends a bearer
            bearer = f"Bearer {headers['x-api-key']}"
        wrong_key = self._api_key is not None and bearer != f"Bearer {self._api_key}"
        if wrong_key and messages_api:
            refusal = _anthropic_error(401, "authentication_error", "invalid x-api-key")
            await _send_json(writer, 401, refusal.body, refusal.headers, keep_alive)
        elif wrong_key and path.startswith("/v1/"):
            message = "Incorrect API key provided. Find your API key at https://platform.openai.com/account/api-keys."
            await _send_json(writer, 401, _error(message, "invalid_request_error", "invalid_api_key"), [], keep_alive)
        elif messages_api:
            await self._messages(writer, request)
        elif (method, path) == ("POST", "/v1/chat/completions"):
            await self._chat(writer, request)
        elif bedrock is not None:
            await self._invoke(writer, request, *bedrock)
        elif (method, path) == ("GET", "/v1/models"):
            data = [{"id": model, "object": "model", "created": 0, "owned_by": "otel-llm"} for model in self.models]
            await _send_json(writer, 200, {"object": "list", "data": data}, [], keep_alive)
        else:
            error = _error(f"Invalid URL ({method} {path})", "invalid_request_error")
            await _send_json(writer, 404, error, [], keep_alive)
        return keep_alive

    async def _chat(self, writer: asyncio.StreamWriter, request: _Request) -> None:
        try:
            payload: Any = json.loads(request.body)
            plan = self._plan(payload)
        except _BadRequest as exc:
            await _send_json(writer, exc.status, exc.body, exc.headers, request.keep_alive)
            return
        except ValueError:
            message = "We could not parse the JSON body of your request. The OpenAI API expects a JSON payload."
            await _send_json(writer, 400, _error(message, "invalid_request_error"), [], request.keep_alive)
            return
        await self._answer(writer, request, plan, _OPENAI)

    async def _invoke(self, writer: asyncio.StreamWriter, request: _Request, model_id: str, stream: bool) -> None:
        try:
            plan = self._plan_claude(request.body, model_id, stream)
        except _BadRequest as exc:
            await _send_json(writer, exc.status, exc.body, exc.headers, request.keep_alive)
            return
        await self._answer(writer, request, plan, _BEDROCK)

    async def _messages(self, writer: asyncio.StreamWriter, request: _Request) -> None:
        try:
            plan = self._plan_messages(request.body)
        except _BadRequest as exc:
            await _send_json(writer, exc.status, exc.body, exc.headers, request.keep_alive)
            return
        await self._answer(writer, request, plan, _ANTHROPIC)

    async def _answer(self, writer: asyncio.StreamWriter, request: _Request, plan: _Plan, dialect: _Dialect) -> None:
        """Rate limits, then queue, prefill and decode through the latency model, answering in `dialect`."""
        now = time.perf_counter_ns()
        rejection = self._limits.admit(plan.prompt_tokens + len(plan.tokens), now)
        headers = dialect.headers(plan, self._limits.refilled(now))
        if rejection is not None:
            self._record(plan, request, 429, 0, [], 0)
            refusal = dialect.rejection(plan, rejection, headers)
            await _send_json(writer, 429, refusal.body, refusal.headers, request.keep_alive)
            return

        events = dialect.stream(writer, plan, request.received_ns) if plan.stream else None
        written: list[int] = []
        queue_wait_ns = 0
        try:
            if events is not None:
                await events.open(headers)
            queued_ns = time.perf_counter_ns()
            await self._slots.acquire()
            queue_wait_ns = time.perf_counter_ns() - queued_ns
            try:
                await self._generate(plan, events, written)
            finally:
                self._slots.release()
        except ConnectionError:
            self._record(plan, request, 499, queue_wait_ns, written, len(written))
            raise
        # Recorded before the last bytes go out, so a client that has its answer finds the record.
        self._record(plan, request, 200, queue_wait_ns, written, len(plan.tokens))
        if events is not None:
            await events.close()
        else:
            await dialect.reply(writer, plan, headers, request)

    async def _generate(self, plan: _Plan, events: _TokenStream | None, written: list[int]) -> None:
        """Prefill, then decode token by token; when streaming, send each token and note its write time."""
        config = self.config
        prefill_s = config.prefill_base_s + config.prefill_per_token_s * plan.prompt_tokens
        if plan.slow:
            prefill_s *= config.tail_prefill_multiplier
        due_ns = time.perf_counter_ns() + round(prefill_s * config.slowdown(self._slots.busy) * 1e9)
        for _, token_json in plan.tokens:
            await asyncio.sleep((due_ns - time.perf_counter_ns()) / 1e9)
            if events is not None:
                written.append(await events.token(token_json))
            due_ns += round(config.tpot_base_s * config.slowdown(self._slots.busy) * 1e9)

    def _plan(self, payload: Any) -> _Plan:
        """Validate a chat request and make the draws for it."""
        if not isinstance(payload, dict):
            raise _invalid(400, "The request body must be a JSON object.")
        model, messages = payload.get("model"), payload.get("messages")
        if not isinstance(model, str):
            raise _invalid(400, "you must provide a model parameter", "model")
        if not isinstance(messages, list) or not messages:
            raise _invalid(400, "'messages' must be a non-empty array.", "messages")
        if model not in self.models:
            raise _invalid(
                404, f"The model `{model}` does not exist or you do not have access to it.", None, "model_not_found"
            )
        if payload.get("n") not in (None, 1):
            raise _invalid(400, "The simulator supports n=1 only.", "n")
        max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
        limit = self.config.max_output_tokens
        if max_tokens is not None and (type(max_tokens) is not int or not 1 <= max_tokens <= limit):
            message = f"max_tokens must be an integer from 1 to {limit}, got {max_tokens!r}."
            raise _invalid(400, message, "max_tokens")
        stream = payload.get("stream") is True
        options = payload.get("stream_options")
        include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
        return self._draw(model, _message_chars(messages), stream, include_usage, max_tokens, "chatcmpl-")

    def _plan_claude(self, body: bytes, model_id: str, stream: bool) -> _Plan:
        """Validate a Claude messages body sent to Bedrock and make the draws for it."""
        if model_id not in self.models:
            raise _bedrock_error(400, "ValidationException", "The provided model identifier is invalid.")
        try:
            payload: Any = json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            raise _bedrock_error(400, "ValidationException", "Malformed input request: the body must be a JSON "
                                 "object, please reformat your input and try again.")
        if payload.get("anthropic_version") != _BEDROCK_ANTHROPIC_VERSION:
            raise _bedrock_error(400, "ValidationException", f"Malformed input request: anthropic_version must be "
                                 f"{_BEDROCK_ANTHROPIC_VERSION}, please reformat your input and try again.")
        try:
            chars, max_tokens = _claude_body(payload, self.config.max_output_tokens)
        except ValueError as exc:
            raise _bedrock_error(400, "ValidationException", f"Malformed input request: {exc}, please reformat your "
                                 "input and try again.") from None
        return self._draw(model_id, chars, stream, False, max_tokens, "msg_bdrk_", max_tokens_caps=True)

    def _plan_messages(self, body: bytes) -> _Plan:
        """Validate a Messages API body and make the draws for it."""
        try:
            payload: Any = json.loads(body)
        except ValueError:
            raise _anthropic_error(400, "invalid_request_error", "The request body is not valid JSON.") from None
        try:
            chars, max_tokens = _claude_body(payload, self.config.max_output_tokens)
        except ValueError as exc:
            raise _anthropic_error(400, "invalid_request_error", str(exc)) from None
        model = payload.get("model")
        if not isinstance(model, str):
            raise _anthropic_error(400, "invalid_request_error", "model: Field required")
        if model not in self.models:
            raise _anthropic_error(404, "not_found_error", f"model: {model}")
        stream = payload.get("stream") is True
        return self._draw(model, chars, stream, False, max_tokens, "msg_", max_tokens_caps=True)

    def _draw(
        self,
        model: str,
        prompt_chars: int,
        stream: bool,
        include_usage: bool,
        max_tokens: int | None,
        id_prefix: str,
        *,
        max_tokens_caps: bool = False,
    ) -> _Plan:
        """The next request's random draws. `max_tokens` is the output length (OpenAI) or, with `max_tokens_caps`,
        a cap on the drawn length (Claude, where it is required)."""
        index, self._next_index = self._next_index, self._next_index + 1
        rng = random.Random(f"{self.seed}/{index}")
        slow = rng.random() < self.config.tail_probability
        if max_tokens is None or max_tokens_caps:
            median, sigma = self.config.output_tokens_median, self.config.output_tokens_sigma
            drawn = min(max(round(rng.lognormvariate(math.log(median), sigma)), 1), self.config.max_output_tokens)
            cap = max_tokens or drawn
            output_tokens, truncated = min(drawn, cap), drawn > cap
        else:
            output_tokens, truncated = max_tokens, True
        return _Plan(
            index=index,
            response_id=f"{id_prefix}{rng.getrandbits(96):024x}",
            created=int(time.time()),
            model=model,
            stream=stream,
            include_usage=include_usage,
            prompt_tokens=max(1, math.ceil(prompt_chars / self.config.chars_per_token)),
            tokens=rng.choices(_TOKENS, k=output_tokens),
            truncated=truncated,
            slow=slow,
        )

    def _record(
        self, plan: _Plan, request: _Request, status: int, queue_wait_ns: int, written: list[int], output_tokens: int
    ) -> None:
        self._records.append(
            TruthRecord(
                index=plan.index,
                request_id=plan.response_id,
                model=plan.model,
                stream=plan.stream,
                status=status,
                received_ns=request.received_ns,
                queue_wait_ns=queue_wait_ns,
                token_ns=tuple(written),
                finished_ns=time.perf_counter_ns(),
                prompt_tokens=plan.prompt_tokens,
                output_tokens=output_tokens,
                slow=plan.slow,
            )
        )


@dataclass(slots=True)
class _Request:
    body: bytes
    received_ns: int
    keep_alive: bool


@dataclass(slots=True)
class _Plan:
    """One chat request's parameters and its random draws."""

    index: int
    response_id: str  # chat completion id or Claude message id
    created: int
    model: str
    stream: bool
    include_usage: bool
    prompt_tokens: int
    tokens: list[tuple[str, bytes]]  # (text, JSON string) per output token
    truncated: bool  # stopped by max_tokens
    slow: bool

    @property
    def finish_reason(self) -> str:
        return "length" if self.truncated else "stop"

    @property
    def stop_reason(self) -> str:
        return "max_tokens" if self.truncated else "end_turn"

    def text(self) -> str:
        return "".join(text for text, _ in self.tokens)

    def chunk_prefix(self) -> str:
        return (
            f'{{"id":"{self.response_id}","object":"chat.completion.chunk","created":{self.created},'
            f'"model":{json.dumps(self.model)},"service_tier":"default","system_fingerprint":"{_FINGERPRINT}",'
            '"choices":['
        )

    def usage_null(self) -> str:
        return ',"usage":null' if self.include_usage else ""

    def usage(self) -> dict[str, object]:
        output = len(self.tokens)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": output,
            "total_tokens": self.prompt_tokens + output,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }


class _SseStream:
    """One chat-completions response's server-sent events; the bytes around each token are built once."""

    def __init__(self, writer: asyncio.StreamWriter, plan: _Plan) -> None:
        self._writer = writer
        prefix, usage_null = plan.chunk_prefix(), plan.usage_null()
        self._role = (
            f'data: {prefix}{{"index":0,"delta":{{"role":"assistant","content":"","refusal":null}},'
            f'"logprobs":null,"finish_reason":null}}]{usage_null}}}\n\n'
        ).encode()
        self._token_head = f'data: {prefix}{{"index":0,"delta":{{"content":'.encode()
        self._token_tail = f'}},"logprobs":null,"finish_reason":null}}]{usage_null}}}\n\n'.encode()
        finish = f'{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"{plan.finish_reason}"}}'
        ending = [f"data: {prefix}{finish}]{usage_null}}}\n\n".encode()]
        if plan.include_usage:
            ending.append(f'data: {prefix}],"usage":{json.dumps(plan.usage())}}}\n\n'.encode())
        ending.append(b"data: [DONE]\n\n")
        self._ending = b"".join(_frame(event) for event in ending) + b"0\r\n\r\n"

    async def open(self, headers: list[tuple[str, str]]) -> None:
        """Response head and the role-only chunk."""
        self._writer.write(_response_head(200, [*_SSE_HEADERS, *headers]) + _frame(self._role))
        await self._writer.drain()

    async def token(self, token_json: bytes) -> int:
        """Send one token's chunk; return its write time."""
        head, tail = self._token_head, self._token_tail
        chunk = b"%x\r\n%b%b%b\r\n" % (len(head) + len(token_json) + len(tail), head, token_json, tail)
        # Stamped before the send: send() releases the GIL, and the woken client may keep it for milliseconds.
        written_ns = time.perf_counter_ns()
        self._writer.write(chunk)
        await self._writer.drain()
        return written_ns

    async def close(self) -> None:
        """Finish chunk, usage chunk when asked for, [DONE], end of the chunked body."""
        self._writer.write(self._ending)
        await self._writer.drain()


class _TokenStream(Protocol):
    async def open(self, headers: list[tuple[str, str]]) -> None:
        """Response head and whatever precedes the first token."""

    async def token(self, token_json: bytes) -> int:
        """Send one token (its text as a JSON string); return its write time."""

    async def close(self) -> None:
        """Everything after the last token, and the end of the chunked body."""


class _BedrockStream:
    """One invoke-with-response-stream answer: Claude's stream events, each one's JSON base64-encoded in an
    event-stream `chunk` message, Bedrock's invocation metrics merged into the last."""

    def __init__(self, writer: asyncio.StreamWriter, plan: _Plan, received_ns: int) -> None:
        self._writer = writer
        self._plan = plan
        self._received_ns = received_ns
        self._first_ns: int | None = None

    async def open(self, headers: list[tuple[str, str]]) -> None:
        head = _response_head(200, [*_BEDROCK_STREAM_HEADERS, *headers])
        events = _claude_opening(self._plan, _claude_usage(self._plan, 1))
        self._writer.write(head + b"".join(_frame(_claude_chunk(_compact(event))) for _, event in events))
        await self._writer.drain()

    async def token(self, token_json: bytes) -> int:
        chunk = _frame(_claude_chunk(_CLAUDE_DELTA % token_json))
        written_ns = time.perf_counter_ns()  # stamped before the send, as in _SseStream.token
        if self._first_ns is None:
            self._first_ns = written_ns
        self._writer.write(chunk)
        await self._writer.drain()
        return written_ns

    async def close(self) -> None:
        plan, now = self._plan, time.perf_counter_ns()
        metrics = {
            "inputTokenCount": plan.prompt_tokens,
            "outputTokenCount": len(plan.tokens),
            "invocationLatency": _ms_since(self._received_ns, now),
            "firstByteLatency": _ms_since(self._received_ns, self._first_ns or now),
        }
        events = [*_claude_closing(plan), ("message_stop", {"type": "message_stop",
                                                             "amazon-bedrock-invocationMetrics": metrics})]
        self._writer.write(b"".join(_frame(_claude_chunk(_compact(event))) for _, event in events) + b"0\r\n\r\n")
        await self._writer.drain()


class _MessagesStream:
    """One streamed Messages API answer: server-sent events named as the API names them (`event:` then compact
    JSON, the `ping` after the first block opens); the bytes around each token are built once."""

    def __init__(self, writer: asyncio.StreamWriter, plan: _Plan) -> None:
        self._writer = writer
        self._opening = b"".join(_frame(_named_event(name, event))
                                 for name, event in _claude_opening(plan, _anthropic_usage(plan, 1)))
        self._opening += _frame(_PING)
        closing = [*_claude_closing(plan), ("message_stop", {"type": "message_stop"})]
        self._closing = b"".join(_frame(_named_event(name, event)) for name, event in closing) + b"0\r\n\r\n"

    async def open(self, headers: list[tuple[str, str]]) -> None:
        self._writer.write(_response_head(200, [*_SSE_HEADERS, *headers]) + self._opening)
        await self._writer.drain()

    async def token(self, token_json: bytes) -> int:
        chunk = _frame(b"event: content_block_delta\ndata: %b\n\n" % (_CLAUDE_DELTA % token_json))
        written_ns = time.perf_counter_ns()  # stamped before the send, as in _SseStream.token
        self._writer.write(chunk)
        await self._writer.drain()
        return written_ns

    async def close(self) -> None:
        self._writer.write(self._closing)
        await self._writer.drain()


class _Dialect(Protocol):
    """What one API spells its own way around the shared latency model."""

    def headers(self, plan: _Plan, buckets: list[_Bucket]) -> list[tuple[str, str]]: ...

    def rejection(self, plan: _Plan, rejection: tuple[_Bucket, int, float], headers: list[tuple[str, str]]) -> (
        _BadRequest
    ): ...

    def stream(self, writer: asyncio.StreamWriter, plan: _Plan, received_ns: int) -> _TokenStream: ...

    async def reply(
        self, writer: asyncio.StreamWriter, plan: _Plan, headers: list[tuple[str, str]], request: _Request
    ) -> None: ...


class _OpenAIDialect:
    def headers(self, plan: _Plan, buckets: list[_Bucket]) -> list[tuple[str, str]]:
        limits = [header for bucket in buckets for header in bucket.headers()]
        return [("x-request-id", f"req_{plan.response_id.removeprefix('chatcmpl-')}"), *limits]

    def rejection(
        self, plan: _Plan, rejection: tuple[_Bucket, int, float], headers: list[tuple[str, str]]
    ) -> _BadRequest:
        bucket, cost, wait_s = rejection
        message = (
            f"Rate limit reached for {plan.model} in organization org-otel-llm-sim on {bucket.label}: "
            f"Limit {bucket.limit}, Used {bucket.limit - bucket.remaining}, Requested {cost}. "
            f"Please try again in {_duration(wait_s)}. {_RATE_LIMIT_DOCS}"
        )
        retry = [("retry-after", str(math.ceil(wait_s))), ("retry-after-ms", str(math.ceil(wait_s * 1000)))]
        return _BadRequest(429, _error(message, bucket.resource, "rate_limit_exceeded"), [*retry, *headers])

    def stream(self, writer: asyncio.StreamWriter, plan: _Plan, received_ns: int) -> _TokenStream:
        return _SseStream(writer, plan)

    async def reply(
        self, writer: asyncio.StreamWriter, plan: _Plan, headers: list[tuple[str, str]], request: _Request
    ) -> None:
        await _send_json(writer, 200, _completion(plan), headers, request.keep_alive)


class _BedrockDialect:
    """Bedrock runtime with the Claude messages body. Bedrock sends no rate-limit headers; a 429 is a
    ThrottlingException."""

    def headers(self, plan: _Plan, buckets: list[_Bucket]) -> list[tuple[str, str]]:
        return [("x-amzn-requestid", str(uuid.UUID(int=int(plan.response_id.removeprefix("msg_bdrk_"), 16))))]

    def rejection(
        self, plan: _Plan, rejection: tuple[_Bucket, int, float], headers: list[tuple[str, str]]
    ) -> _BadRequest:
        return _bedrock_error(429, "ThrottlingException", "Too many requests, please wait before trying again.",
                              headers)

    def stream(self, writer: asyncio.StreamWriter, plan: _Plan, received_ns: int) -> _TokenStream:
        return _BedrockStream(writer, plan, received_ns)

    async def reply(
        self, writer: asyncio.StreamWriter, plan: _Plan, headers: list[tuple[str, str]], request: _Request
    ) -> None:
        body = {**_claude_message(plan, [{"type": "text", "text": plan.text()}]),
                "usage": _claude_usage(plan, len(plan.tokens))}
        bedrock = [
            ("x-amzn-bedrock-input-token-count", str(plan.prompt_tokens)),
            ("x-amzn-bedrock-output-token-count", str(len(plan.tokens))),
            ("x-amzn-bedrock-invocation-latency", str(_ms_since(request.received_ns, time.perf_counter_ns()))),
        ]
        await _send_json(writer, 200, body, [*headers, *bedrock], request.keep_alive)


class _AnthropicDialect:
    """The Anthropic Messages API: `request-id` and `anthropic-ratelimit-*` headers on every answer."""

    def headers(self, plan: _Plan, buckets: list[_Bucket]) -> list[tuple[str, str]]:
        limits = [header for bucket in buckets for header in bucket.anthropic_headers()]
        return [("request-id", _anthropic_request_id(plan.response_id)), *limits]

    def rejection(
        self, plan: _Plan, rejection: tuple[_Bucket, int, float], headers: list[tuple[str, str]]
    ) -> _BadRequest:
        bucket, cost, wait_s = rejection
        message = (
            f"This request would exceed the rate limit for your organization of {bucket.limit} {bucket.resource} "
            f"per minute (requested {cost}). You can see the response headers for current usage. Please reduce "
            "the prompt length or the maximum tokens requested, or try again later."
        )
        body = _anthropic_body("rate_limit_error", message, _anthropic_request_id(plan.response_id))
        return _BadRequest(429, body, [("retry-after", str(math.ceil(wait_s))), *headers])

    def stream(self, writer: asyncio.StreamWriter, plan: _Plan, received_ns: int) -> _TokenStream:
        return _MessagesStream(writer, plan)

    async def reply(
        self, writer: asyncio.StreamWriter, plan: _Plan, headers: list[tuple[str, str]], request: _Request
    ) -> None:
        body = {**_claude_message(plan, [{"type": "text", "text": plan.text()}]),
                "usage": _anthropic_usage(plan, len(plan.tokens))}
        await _send_json(writer, 200, body, headers, request.keep_alive)


_OPENAI = _OpenAIDialect()
_BEDROCK = _BedrockDialect()
_ANTHROPIC = _AnthropicDialect()


class _BadRequest(Exception):
    """A request refused before any draw: status, JSON body and headers of the answer."""

    def __init__(self, status: int, body: dict[str, object], headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or []


def _invalid(status: int, message: str, param: str | None = None, code: str | None = None) -> _BadRequest:
    return _BadRequest(status, _error(message, "invalid_request_error", code, param))


def _anthropic_error(status: int, kind: str, message: str) -> _BadRequest:
    """An error refused before any draw, as the Messages API sends it: typed body, `request-id` header."""
    request_id = _anthropic_request_id(uuid.uuid4().hex)
    return _BadRequest(status, _anthropic_body(kind, message, request_id), [("request-id", request_id)])


def _anthropic_body(kind: str, message: str, request_id: str) -> dict[str, object]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}


def _anthropic_request_id(message_id: str) -> str:
    return f"req_{message_id.removeprefix('msg_')}"


def _bedrock_error(status: int, code: str, message: str, headers: list[tuple[str, str]] | None = None) -> _BadRequest:
    """An error as Bedrock sends it: the code in `x-amzn-ErrorType`, where botocore reads it, the message in JSON."""
    error_type = ("x-amzn-ErrorType", f"{code}:http://internal.amazon.com/coral/com.amazon.bedrock/")
    return _BadRequest(status, {"message": message}, [error_type, *(headers or [])])


class _Slots:
    """Decode slots, handed out first come, first served."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self.busy = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.busy < self._capacity and not self._waiters:
            self.busy += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if not waiter.cancelled():  # handed a slot in the same turn as the cancellation
                self.release()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # skip waiters cancelled but not yet resumed
                waiter.set_result(None)  # the slot passes straight on; busy is unchanged
                return
        self.busy -= 1


class _Bucket:
    """A token bucket of `limit` per minute, refilled continuously."""

    def __init__(self, resource: str, label: str, limit: int, now_ns: int) -> None:
        self.resource = resource
        self.label = label
        self.limit = limit
        self._level = float(limit)
        self._per_ns = limit / 60e9
        self._stamp_ns = now_ns

    @property
    def remaining(self) -> int:
        return math.floor(self._level)

    def refill(self, now_ns: int) -> None:
        self._level = min(self.limit, self._level + (now_ns - self._stamp_ns) * self._per_ns)
        self._stamp_ns = now_ns

    def shortfall_s(self, cost: int) -> float:
        """Seconds until `cost` fits; 0 when it fits now."""
        return max(0.0, (cost - self._level) / self._per_ns / 1e9)

    def take(self, cost: int) -> None:
        self._level -= cost

    def full_in_s(self) -> float:
        return (self.limit - self._level) / self._per_ns / 1e9

    def headers(self) -> list[tuple[str, str]]:
        """OpenAI's spelling."""
        return [
            (f"x-ratelimit-limit-{self.resource}", str(self.limit)),
            (f"x-ratelimit-remaining-{self.resource}", str(self.remaining)),
            (f"x-ratelimit-reset-{self.resource}", _duration(self.full_in_s())),
        ]

    def anthropic_headers(self) -> list[tuple[str, str]]:
        """Anthropic's spelling: the reset is the wall-clock time the bucket is full again, RFC 3339 in whole
        seconds."""
        full_at = datetime.datetime.fromtimestamp(math.ceil(time.time() + self.full_in_s()), datetime.UTC)
        prefix = f"anthropic-ratelimit-{self.resource}"
        return [
            (f"{prefix}-limit", str(self.limit)),
            (f"{prefix}-remaining", str(self.remaining)),
            (f"{prefix}-reset", full_at.strftime("%Y-%m-%dT%H:%M:%SZ")),
        ]


class _RateLimits:
    def __init__(self, config: EngineConfig) -> None:
        now = time.perf_counter_ns()
        limits = (
            ("requests", "requests per min (RPM)", config.requests_per_minute),
            ("tokens", "tokens per min (TPM)", config.tokens_per_minute),
        )
        self._buckets = [_Bucket(resource, label, limit, now) for resource, label, limit in limits if limit]

    def admit(self, tokens: int, now_ns: int) -> tuple[_Bucket, int, float] | None:
        """Charge a request of `tokens` tokens, or charge nothing and return (bucket, cost, seconds to wait)."""
        costs = [(bucket, 1 if bucket.resource == "requests" else tokens) for bucket in self._buckets]
        for bucket, cost in costs:
            bucket.refill(now_ns)
            wait_s = bucket.shortfall_s(cost)
            if wait_s > 0:
                return bucket, cost, wait_s
        for bucket, cost in costs:
            bucket.take(cost)
        return None

    def refilled(self, now_ns: int) -> list[_Bucket]:
        """The buckets, brought up to `now_ns`, for the rate-limit headers."""
        for bucket in self._buckets:
            bucket.refill(now_ns)
        return self._buckets


_BEDROCK_STREAM_HEADERS = [
    ("content-type", "application/vnd.amazon.eventstream"),
    ("x-amzn-bedrock-content-type", "application/json"),
    ("transfer-encoding", "chunked"),
]
_CLAUDE_DELTA = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%b}}'
_PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # the API writes this one with spaces
_SSE_HEADERS = [
    ("content-type", "text/event-stream; charset=utf-8"),
    ("transfer-encoding", "chunked"),
    ("cache-control", "no-cache"),
]


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, path without query, and lower-cased headers of an HTTP/1.1 request head."""
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _version = request_line.split(" ")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return method, target.partition("?")[0], headers


def _bedrock_route(path: str) -> tuple[str, bool] | None:
    """(model id, streaming) for Bedrock runtime's invoke paths, else None. botocore percent-encodes the id."""
    parts = path.split("/")
    if len(parts) == 4 and parts[:2] == ["", "model"] and parts[3] in ("invoke", "invoke-with-response-stream"):
        return urllib.parse.unquote(parts[2]), parts[3] == "invoke-with-response-stream"
    return None


def _response_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "server: otel-llm-simulator"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _send_json(
    writer: asyncio.StreamWriter, status: int, payload: object, headers: list[tuple[str, str]], keep_alive: bool
) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    framing = [("content-type", "application/json"), ("content-length", str(len(body)))]
    if not keep_alive:
        framing.append(("connection", "close"))
    writer.write(_response_head(status, [*framing, *headers]) + body)
    await writer.drain()


def _frame(data: bytes) -> bytes:
    """One chunk of a chunked HTTP body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def _error(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _completion(plan: _Plan) -> dict[str, object]:
    message: dict[str, object] = {"role": "assistant", "content": plan.text(), "refusal": None, "annotations": []}
    return {
        "id": plan.response_id,
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish_reason}],
        "usage": plan.usage(),
        "service_tier": "default",
        "system_fingerprint": _FINGERPRINT,
    }


def _claude_message(plan: _Plan, content: list[dict[str, str]]) -> dict[str, object]:
    return {"id": plan.response_id, "type": "message", "role": "assistant", "model": plan.model, "content": content,
            "stop_reason": plan.stop_reason, "stop_sequence": None}


def _claude_usage(plan: _Plan, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": plan.prompt_tokens, "output_tokens": output_tokens}


def _anthropic_usage(plan: _Plan, output_tokens: int) -> dict[str, object]:
    return {"input_tokens": plan.prompt_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": output_tokens, "service_tier": "standard"}


def _claude_opening(plan: _Plan, usage: dict[str, Any]) -> list[tuple[str, dict[str, object]]]:
    """The stream events before the first token: `message_start` with `usage`, the text block's start."""
    message = {**_claude_message(plan, []), "stop_reason": None, "usage": usage}
    return [("message_start", {"type": "message_start", "message": message}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}})]


def _claude_closing(plan: _Plan) -> list[tuple[str, dict[str, object]]]:
    """The stream events after the last token, up to `message_stop`."""
    delta = {"stop_reason": plan.stop_reason, "stop_sequence": None}
    return [("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": delta,
                               "usage": {"output_tokens": len(plan.tokens)}})]


def _claude_body(payload: Any, max_output_tokens: int) -> tuple[int, int]:
    """(prompt characters, max_tokens) of a Claude messages body; ValueError saying what is wrong otherwise."""
    if not isinstance(payload, dict):
        raise ValueError("the body must be a JSON object")
    messages, max_tokens = payload.get("messages"), payload.get("max_tokens")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty array")
    if type(max_tokens) is not int or not 1 <= max_tokens <= max_output_tokens:
        raise ValueError(f"max_tokens must be an integer from 1 to {max_output_tokens}")
    return _message_chars([{"content": payload.get("system")}, *messages]), max_tokens


def _named_event(name: str, event: object) -> bytes:
    """One server-sent event as the Messages API writes it: its name, then compact JSON."""
    return b"event: %b\ndata: %b\n\n" % (name.encode(), _compact(event))


def _claude_chunk(event_json: bytes) -> bytes:
    """A Bedrock `chunk` event carrying one Claude stream event, padded with `p` as Bedrock pads them."""
    return _eventstream.event("chunk", b'{"bytes":"%b","p":"%b"}' % (base64.b64encode(event_json), _PADDING))


def _compact(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _ms_since(start_ns: int, end_ns: int) -> int:
    return round((end_ns - start_ns) / 1e6)


def _message_chars(messages: list[Any]) -> int:
    """Characters of text in chat messages: string contents and text parts."""
    chars = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return chars


def _duration(seconds: float) -> str:
    """A duration the way OpenAI's x-ratelimit-reset-* headers spell it: 20ms, 1.5s, 6m0s."""
    ms = math.ceil(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms"
    minutes, ms = divmod(ms, 60_000)
    secs = f"{ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
