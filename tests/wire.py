"""Fake OpenAI at the wire: the real client runs unmodified against bytes a real server would send.

Three layers, each usable on its own:

* Body builders: byte-exact SSE events and JSON bodies in OpenAI's shapes (`chat_stream`, `responses_stream`,
  `completion_stream`, `chat_completion_body`, `response_body`, `compaction_body`, `decision_body`,
  `completion_body`, `embedding_body`, `error_body`, `sse_error_event`).
* `Reply`: one scripted HTTP response - status, headers, body, pauses, and an optional mid-body disconnect.
* Two transports serving queued replies and recording every request (`RecordedRequest`, with server-side
  clock marks): `mock_client()` (an in-process `MockTransport` of the HTTP library openai really imports) and
  `LoopbackServer` (a real HTTP/1.1 server on 127.0.0.1).

All clock marks are `time.perf_counter_ns()` in this process, so they compare directly with client-side marks.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import functools
import importlib
import json
import random
import socket
import socketserver
import struct
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import httpx2

Json = dict[str, Any]

CHAT_MODEL = "gpt-4o-mini-2024-07-18"
COMPLETION_MODEL = "gpt-3.5-turbo-instruct"
EMBEDDING_MODEL = "text-embedding-3-small"
CREATED = 1_735_689_600  # a fixed unix time (2025-01-01) keeps every body byte-identical between runs
SYSTEM_FINGERPRINT = "fp_0ba0d124f1"
OBFUSCATION = "Xq3k"  # OpenAI pads stream events with a random `obfuscation` string; a fixed one here
TOOL_CALL_ID = "call_abc"
TOOL_NAME = "get_weather"
MESSAGE_ID = "msg_abc"
DONE = b"data: [DONE]\n\n"


# --- body builders ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """Token counts as OpenAI reports them: `input` includes `cached` and `cache_write`, `output` includes
    `reasoning`. Chat usage names cache writes only where there are some (the client's field is optional)."""

    input: int
    output: int
    cached: int = 0
    reasoning: int = 0
    cache_write: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output


# values a server may send where the client's types say otherwise: each of another type
ODD_VALUES: list[Any] = [None, 0, -1, 1.5, "", "x", [], {}, [1], {"a": 1}, True, 10**20]


def oddly(data: Any, rng: random.Random) -> Any:
    """A copy of a JSON value with one or two of its values, at any depth, replaced by an odd one or removed."""
    data = copy.deepcopy(data)
    paths = list(_paths(data, []))
    for path in rng.sample(paths, min(len(paths), rng.randint(1, 2))):
        parent = data
        with contextlib.suppress(KeyError, IndexError, TypeError):  # an earlier change may have moved it
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict) and rng.random() < 0.15:
                del parent[path[-1]]
            else:
                parent[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
    return data


def _paths(value: Any, path: list[Any]) -> Iterator[list[Any]]:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield [*path, key]
        yield from _paths(item, [*path, key])


def unasked(events: list[bytes]) -> list[bytes]:
    """What an OpenAI chat stream sends when it is not asked for usage, from the one it sends when it is: no usage
    chunk (no choices, a usage), and no usage field in the other chunks (asked, each has ``"usage": null``)."""
    sent = []
    for event in events:
        if not event.startswith(b"data: {"):
            sent.append(event)
            continue
        data = json.loads(event.removeprefix(b"data: "))
        if not (data.get("choices") == [] and isinstance(data.get("usage"), dict)):
            data.pop("usage", None)
            sent.append(sse(data))
    return sent


def sse(data: Json | str, *, event: str | None = None) -> bytes:
    """One complete server-sent event; dicts become compact JSON, as OpenAI sends them."""
    text = data if isinstance(data, str) else _compact(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def chat_stream(
    tokens: list[str],
    *,
    model: str = CHAT_MODEL,
    id: str = "chatcmpl-abc",
    usage: Usage | None = None,
    finish_reason: str | None = None,
    tool_call: bool = False,
) -> list[bytes]:
    """A /v1/chat/completions stream, one SSE event per element, ending with `[DONE]`.

    The first chunk opens the message (`role`, empty `content`) and carries no token. With `tool_call`, it opens
    a tool call instead (id and name, empty arguments) and each token is an `arguments` delta. Then one chunk per
    token, one with an empty delta and `finish_reason` (default "stop", or "tool_calls"), and - only when `usage`
    is given, i.e. the request asked `stream_options={"include_usage": True}` - a last chunk with `choices: []`
    and the usage; every other chunk then carries `"usage": null`, as the real server does.
    """

    def chunk(delta: Json, finish: str | None = None) -> Json:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _chat_chunk(id, model, [choice], {} if usage is None else {"usage": None})

    opening: Json
    deltas: list[Json]
    if tool_call:
        opening = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"index": 0, "id": TOOL_CALL_ID, "type": "function", "function": {"name": TOOL_NAME, "arguments": ""}}
            ],
            "refusal": None,
        }
        deltas = [{"tool_calls": [{"index": 0, "function": {"arguments": token}}]} for token in tokens]
    else:
        opening = {"role": "assistant", "content": "", "refusal": None}
        deltas = [{"content": token} for token in tokens]
    chunks = [chunk(opening), *(chunk(delta) for delta in deltas)]
    chunks.append(chunk({}, finish_reason or ("tool_calls" if tool_call else "stop")))
    if usage is not None:
        chunks.append(_chat_chunk(id, model, [], {"usage": _chat_usage(usage)}))
    return [*(sse(c) for c in chunks), DONE]


def responses_stream(
    tokens: list[str],
    *,
    model: str = CHAT_MODEL,
    id: str = "resp_abc",
    usage: Usage | None = None,
    conversation: str | None = None,
) -> list[bytes]:
    """A /v1/responses stream (`event:` + `data:` lines) for one text message, numbered by `sequence_number`.

    Only `response.output_text.delta` events carry tokens. `usage` lands in `response.completed`; None sends
    `"usage": null` there (real servers always report it, so pass one unless testing its absence). Every response
    object names `conversation` when one is given.
    """
    text = "".join(tokens)
    empty_part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
    full_part = {**empty_part, "text": text}
    where = {"item_id": MESSAGE_ID, "output_index": 0, "content_index": 0}
    item_in_progress = {
        "id": MESSAGE_ID,
        "type": "message",
        "status": "in_progress",
        "content": [],
        "role": "assistant",
    }
    item_done = _message_item(text)
    def response(status: str, output: list[Json], usage: Usage | None) -> Json:
        found = _response(id, model, status, output, usage)
        return found if conversation is None else {**found, "conversation": {"id": conversation}}

    events: list[tuple[str, Json]] = [
        ("response.created", {"response": response("in_progress", [], None)}),
        ("response.in_progress", {"response": response("in_progress", [], None)}),
        ("response.output_item.added", {"output_index": 0, "item": item_in_progress}),
        ("response.content_part.added", {**where, "part": empty_part}),
        *(
            ("response.output_text.delta", {**where, "delta": token, "logprobs": [], "obfuscation": OBFUSCATION})
            for token in tokens
        ),
        ("response.output_text.done", {**where, "text": text, "logprobs": []}),
        ("response.content_part.done", {**where, "part": full_part}),
        ("response.output_item.done", {"output_index": 0, "item": item_done}),
        ("response.completed", {"response": response("completed", [item_done], usage)}),
    ]
    return [sse({"type": kind, "sequence_number": n, **data}, event=kind) for n, (kind, data) in enumerate(events)]


def completion_stream(
    tokens: list[str],
    *,
    model: str = COMPLETION_MODEL,
    id: str = "cmpl-abc",
    usage: Usage | None = None,
    finish_reason: str = "stop",
) -> list[bytes]:
    """A legacy /v1/completions stream: one `choices[0].text` per token (no opening chunk), an empty-text chunk
    with `finish_reason`, a `choices: []` usage chunk when `usage` is given, then `[DONE]`."""

    def chunk(choices: list[Json]) -> Json:
        return {
            "id": id,
            "object": "text_completion",
            "created": CREATED,
            "choices": choices,
            "model": model,
            "system_fingerprint": None,
        }

    def choice(text: str, finish: str | None) -> Json:
        return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}

    chunks = [chunk([choice(token, None)]) for token in tokens]
    chunks.append(chunk([choice("", finish_reason)]))
    if usage is not None:
        chunks.append({**chunk([]), "usage": _plain_usage(usage)})
    return [*(sse(c) for c in chunks), DONE]


def sse_error_event(message: str, *, type: str = "server_error", code: str | None = None) -> bytes:
    """A mid-stream `data: {"error": ...}` event: openai raises `APIError` on it for chat and completions."""
    return sse(error_body(message, type=type, code=code))


def chat_completion_body(
    text: str,
    *,
    model: str = CHAT_MODEL,
    id: str = "chatcmpl-abc",
    usage: Usage | None = None,
    finish_reason: str = "stop",
) -> Json:
    """A non-streamed /v1/chat/completions body (`usage: None` sends `"usage": null`)."""
    message: Json = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
    return {
        "id": id,
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": _chat_usage(usage) if usage else None,
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def response_body(text: str, *, model: str = CHAT_MODEL, id: str = "resp_abc", usage: Usage | None = None) -> Json:
    """A non-streamed, completed /v1/responses body holding one text message."""
    return _response(id, model, "completed", [_message_item(text)], usage)


def compaction_body(user_texts: list[str], *, id: str = "cmp_abc", usage: Usage) -> Json:
    """A /v1/responses/compact body: the user messages kept, then one encrypted compaction item."""
    kept = [{"id": f"msg_{index}", "type": "message", "status": "completed", "role": "user",
             "content": [{"type": "input_text", "text": text}]} for index, text in enumerate(user_texts)]
    compacted = {"id": "cmp_item_1", "type": "compaction", "encrypted_content": "gAAAAABpZ2VuY3J5cHRlZA=="}
    return {"id": id, "object": "response.compaction", "created_at": CREATED, "output": [*kept, compacted],
            "usage": _responses_usage(usage), "service_tier": "default"}


def decision_body(answers: list[Json], *, model: str = "gpt-6-luna", usage: Usage) -> Json:
    """A /v1/decisions body: an answer per question, in their order; the model and usage, and no id."""
    return {"answers": answers, "model": model, "usage": _responses_usage(usage)}


def completion_body(
    text: str,
    *,
    model: str = COMPLETION_MODEL,
    id: str = "cmpl-abc",
    usage: Usage | None = None,
    finish_reason: str = "stop",
) -> Json:
    """A non-streamed legacy /v1/completions body."""
    return {
        "id": id,
        "object": "text_completion",
        "created": CREATED,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
        "usage": _plain_usage(usage) if usage else None,
    }


def embedding_vector(index: int, dims: int) -> list[float]:
    """The vector `embedding_body` returns for input `index`: exact in float32, so base64 round-trips exactly."""
    return [(index + 1) * (j - dims / 2) / 8 for j in range(dims)]


def embedding_body(
    n_inputs: int,
    dims: int = 8,
    *,
    model: str = EMBEDDING_MODEL,
    usage_prompt_tokens: int,
    encoding_format: Literal["base64", "float"] = "base64",
) -> Json:
    """A /v1/embeddings body. openai asks for base64 unless the caller picks a format, hence the default."""

    def encode(vector: list[float]) -> str | list[float]:
        if encoding_format == "float":
            return vector
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()

    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode(embedding_vector(i, dims))} for i in range(n_inputs)
        ],
        "model": model,
        "usage": {"prompt_tokens": usage_prompt_tokens, "total_tokens": usage_prompt_tokens},
    }


def error_body(message: str, *, type: str = "invalid_request_error", code: str | None = None) -> Json:
    """OpenAI's error envelope, used for 4xx/5xx bodies and mid-stream errors."""
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


def openai_ratelimit_headers(
    limit_requests: int,
    remaining_requests: int,
    limit_tokens: int,
    remaining_tokens: int,
    *,
    reset_requests: str = "1s",
    reset_tokens: str = "6ms",
) -> dict[str, str]:
    """The `x-ratelimit-*` headers OpenAI puts on every response (resets in its duration format, e.g. "6m0s")."""
    return {
        "x-ratelimit-limit-requests": str(limit_requests),
        "x-ratelimit-limit-tokens": str(limit_tokens),
        "x-ratelimit-remaining-requests": str(remaining_requests),
        "x-ratelimit-remaining-tokens": str(remaining_tokens),
        "x-ratelimit-reset-requests": reset_requests,
        "x-ratelimit-reset-tokens": reset_tokens,
    }


def _compact(data: Json) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _chat_usage(usage: Usage) -> Json:
    return {
        **_plain_usage(usage),
        "prompt_tokens_details": {
            "cached_tokens": usage.cached,
            "audio_tokens": 0,
            **({"cache_write_tokens": usage.cache_write} if usage.cache_write else {}),
        },
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _plain_usage(usage: Usage) -> Json:
    return {"prompt_tokens": usage.input, "completion_tokens": usage.output, "total_tokens": usage.total}


def _chat_chunk(id: str, model: str, choices: list[Json], usage_field: Json) -> Json:
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": choices,
        **usage_field,
        "obfuscation": OBFUSCATION,
    }


def _message_item(text: str) -> Json:
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    return {"id": MESSAGE_ID, "type": "message", "status": "completed", "content": [part], "role": "assistant"}


def _response(id: str, model: str, status: str, output: list[Json], usage: Usage | None) -> Json:
    return {
        "id": id,
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "background": False,
        "completed_at": CREATED + 1 if status == "completed" else None,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "max_tool_calls": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "prompt_cache_key": None,
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": None,
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": _responses_usage(usage) if usage else None,
        "user": None,
        "metadata": {},
    }


def _responses_usage(usage: Usage) -> Json:
    return {
        "input_tokens": usage.input,
        "input_tokens_details": {"cached_tokens": usage.cached, "cache_write_tokens": usage.cache_write},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning},
        "total_tokens": usage.total,
    }


# --- scripted replies and recorded requests -------------------------------------------------------------------


@dataclass
class Reply:
    """One scripted HTTP response.

    `body`: a list of bytes is streamed, one chunk per element (chunked transfer-encoding, `text/event-stream`);
    a dict is sent as JSON and raw bytes as they are (both with content-length, `application/json` unless
    `headers` says otherwise).

    Timing, all in seconds: `headers_delay` passes between the request being fully received and the status line
    and headers going out; `delays[i]` passes before body chunk i, counted from the previous chunk (from the
    headers for i = 0). Missing trailing delays are 0. So the server-side time to first chunk is
    `headers_delay + delays[0]`.

    `drop_after=n` sends the headers and the first n chunks, then closes the connection: the client sees a
    transport error. A streamed body is left unterminated even at `n = len(chunks)`; a JSON body at `n = 0`.
    """

    status: int = 200
    body: list[bytes] | Json | bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    headers_delay: float = 0.0
    delays: list[float] | None = None
    drop_after: int | None = None

    def __post_init__(self) -> None:
        content_type = "text/event-stream; charset=utf-8" if self.streamed else "application/json"
        self.headers = {"content-type": content_type, **{name.lower(): value for name, value in self.headers.items()}}
        if self.streamed and not all(self.chunks):
            raise ValueError("an empty chunk would end a chunked body early")
        if self.delays is not None and len(self.delays) > len(self.chunks):
            raise ValueError(f"{len(self.delays)} delays for {len(self.chunks)} chunks")
        if self.drop_after is not None and not 0 <= self.drop_after <= len(self.chunks):
            raise ValueError(f"drop_after={self.drop_after} outside 0..{len(self.chunks)}")

    @classmethod
    def stream(
        cls,
        events: list[bytes],
        *,
        headers_delay: float = 0.0,
        delays: list[float] | None = None,
        drop_after: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """A 200 SSE stream of `events` (e.g. from `chat_stream`)."""
        return cls(200, events, headers or {}, headers_delay, delays, drop_after)

    @classmethod
    def json(
        cls, body: Json, *, status: int = 200, headers: dict[str, str] | None = None, headers_delay: float = 0.0
    ) -> Reply:
        """A JSON reply, e.g. `Reply.json(error_body(...), status=400)`."""
        return cls(status, body, headers or {}, headers_delay)

    @classmethod
    def rate_limited(cls, retry_after: float = 1.0, *, headers: dict[str, str] | None = None) -> Reply:
        """A 429 as OpenAI sends it: error envelope, `retry-after` and exhausted `x-ratelimit-*` headers."""
        message = "Rate limit reached for requests per min (RPM): Limit 500, Used 500, Requested 1."
        limits = openai_ratelimit_headers(500, 0, 200_000, 199_000, reset_requests=f"{retry_after:g}s")
        return cls.json(
            error_body(message, type="requests", code="rate_limit_exceeded"),
            status=429,
            headers={"retry-after": f"{retry_after:g}", **limits, **(headers or {})},
        )

    @property
    def streamed(self) -> bool:
        return isinstance(self.body, list)

    @property
    def chunks(self) -> list[bytes]:
        """The body as written to the wire, one element per write."""
        if isinstance(self.body, list):
            return self.body
        if isinstance(self.body, dict):
            # OpenAI pretty-prints non-streamed JSON bodies.
            return [json.dumps(self.body, indent=2, ensure_ascii=False).encode()]
        return [self.body]

    def wire_headers(self) -> dict[str, str]:
        """`headers` plus the framing header a server adds."""
        if self.streamed:
            return {**self.headers, "transfer-encoding": "chunked"}
        return {**self.headers, "content-length": str(len(self.chunks[0]))}

    def writes(self) -> list[tuple[float, bytes]]:
        """(pause, chunk) for every chunk actually sent, `drop_after` applied."""
        pauses = [*(self.delays or ()), *(0.0 for _ in self.chunks)]
        return list(zip(pauses, self.chunks[: self.drop_after], strict=False))

    @property
    def truncated(self) -> bool:
        """Whether the connection closes before the body is complete."""
        return self.drop_after is not None and (self.streamed or self.drop_after < len(self.chunks))


@dataclass
class RecordedRequest:
    """A request as the fake server saw it, with server-side `perf_counter_ns` marks.

    Each `*_sent_ns` mark is taken just before the bytes are handed to the transport, so it never postdates the
    client receiving them.
    """

    method: str
    path: str  # without the query string, e.g. "/v1/chat/completions"
    headers: dict[str, str]  # names lower-cased
    body: bytes
    received_ns: int  # the whole request had been read
    client_port: int | None = None  # loopback only: one port per connection, so kept-alive requests share it
    headers_sent_ns: int | None = None
    chunks_sent_ns: list[int] = field(default_factory=list)

    @property
    def json(self) -> Any:
        """The parsed JSON body, or None when the body is empty or not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


ReplySource = Sequence[Reply] | Callable[[RecordedRequest], Reply]


class Recorder:
    """Answers requests with queued replies in order, or through a function, and keeps every request."""

    def __init__(self, replies: ReplySource = ()) -> None:
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._function = replies if callable(replies) else None
        self._queue: deque[Reply] = deque(() if callable(replies) else replies)

    def push(self, *replies: Reply) -> None:
        """Queue more replies."""
        if self._function is not None:
            raise TypeError("this recorder answers through a function")
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """Queued replies not served yet."""
        return len(self._queue)

    def answer(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            queued = self._queue.popleft() if self._queue else None
        if self._function is not None:
            return self._function(request)
        if queued is not None:
            return queued
        # A loud failure rather than a hang when a test scripts too few replies; 418 so openai never retries it.
        message = f"wire: no reply queued for {request.method} {request.path}"
        return Reply.json(error_body(message, type="wire_script_exhausted"), status=418)


# --- in-process transport ---------------------------------------------------------------------------------------


@functools.cache
def http_module() -> ModuleType:
    """The HTTP library the installed openai client is built on (`httpx2` for openai 3.x, `httpx` before)."""
    import openai

    for cls in openai.DefaultHttpxClient.__mro__:
        package = cls.__module__.partition(".")[0]
        if cls.__name__ == "Client" and package != "openai":
            return importlib.import_module(package)
    raise RuntimeError("cannot find the HTTP client class openai.DefaultHttpxClient derives from")


def _incomplete_body(request: httpx2.Request, reply: Reply) -> Exception:
    # The class and message the real transport raises when the server closes before the body is complete.
    if reply.streamed:
        detail = "incomplete chunked read"
    else:
        detail = f"received {sum(len(chunk) for _, chunk in reply.writes())} bytes, expected {len(reply.chunks[0])}"
    message = f"peer closed connection without sending complete message body ({detail})"
    error: Exception = http_module().RemoteProtocolError(message, request=request)
    return error


class _InProcessServer:
    """The `MockTransport` handler: answers from a Recorder and streams bodies chunk by chunk, honoring pauses."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        recorded, reply = self._answer(request)
        time.sleep(reply.headers_delay)
        return self._response(request, recorded, reply, self._body(request, recorded, reply))

    async def handle_async(self, request: httpx2.Request) -> httpx2.Response:
        recorded, reply = self._answer(request)
        import anyio  # here: the venvs of older clients may have no anyio (botocore's needs none)

        await anyio.sleep(reply.headers_delay)  # anyio's: async clients run on asyncio and trio alike
        return self._response(request, recorded, reply, self._abody(request, recorded, reply))

    def _answer(self, request: httpx2.Request) -> tuple[RecordedRequest, Reply]:
        recorded = RecordedRequest(
            method=request.method,
            path=request.url.path,
            headers={name.lower(): value for name, value in request.headers.items()},
            body=request.content,
            received_ns=time.perf_counter_ns(),
        )
        return recorded, self.recorder.answer(recorded)

    @staticmethod
    def _response(
        request: httpx2.Request, recorded: RecordedRequest, reply: Reply, body: Iterator[bytes] | AsyncIterator[bytes]
    ) -> httpx2.Response:
        recorded.headers_sent_ns = time.perf_counter_ns()
        response: httpx2.Response = http_module().Response(
            reply.status, headers=reply.wire_headers(), content=body, request=request
        )
        return response

    @staticmethod
    def _body(request: httpx2.Request, recorded: RecordedRequest, reply: Reply) -> Iterator[bytes]:
        for pause, chunk in reply.writes():
            time.sleep(pause)
            recorded.chunks_sent_ns.append(time.perf_counter_ns())
            yield chunk
        if reply.truncated:
            raise _incomplete_body(request, reply)

    @staticmethod
    async def _abody(request: httpx2.Request, recorded: RecordedRequest, reply: Reply) -> AsyncIterator[bytes]:
        import anyio

        for pause, chunk in reply.writes():
            await anyio.sleep(pause)
            recorded.chunks_sent_ns.append(time.perf_counter_ns())
            yield chunk
        if reply.truncated:
            raise _incomplete_body(request, reply)


@overload
def mock_client(replies: ReplySource, *, async_: Literal[False] = False) -> tuple[httpx2.Client, Recorder]: ...
@overload
def mock_client(replies: ReplySource, *, async_: Literal[True]) -> tuple[httpx2.AsyncClient, Recorder]: ...
def mock_client(replies: ReplySource, *, async_: bool = False) -> tuple[httpx2.Client | httpx2.AsyncClient, Recorder]:
    """An HTTP client (pass it as openai's `http_client=`) whose transport serves `replies` in process.

    Bodies really stream: each chunk reaches the client only after its delay, via the iterator the client reads.
    """
    http = http_module()
    recorder = Recorder(replies)
    server = _InProcessServer(recorder)
    if async_:
        return http.AsyncClient(transport=http.MockTransport(server.handle_async)), recorder
    return http.Client(transport=http.MockTransport(server.handle)), recorder


# --- loopback server --------------------------------------------------------------------------------------------


class _HTTPServer(socketserver.ThreadingTCPServer):
    # Non-daemon handler threads, joined by server_close(): nothing outlives the server.
    daemon_threads = False
    block_on_close = True

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.closing = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Registered on the accept thread, so once shutdown() returns every open connection is in the set.
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
            super().shutdown_request(request)

    def disconnect_all(self) -> None:
        """Unblock handlers waiting on idle keep-alive connections or on writes."""
        with self._connections_lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # TCP_NODELAY: each chunk leaves when written
    server: _HTTPServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        recorded = RecordedRequest(
            method=self.command,
            path=urlsplit(self.path).path,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
            received_ns=time.perf_counter_ns(),
            client_port=self.client_address[1],
        )
        self._send(self.server.recorder.answer(recorded), recorded)

    do_GET = do_POST

    def handle(self) -> None:
        # Clients reset connections all the time: openai stops reading at [DONE], a user breaks out of a stream.
        with contextlib.suppress(ConnectionError):
            super().handle()

    def _send(self, reply: Reply, recorded: RecordedRequest) -> None:
        if not self._pause(reply.headers_delay):
            return
        self.send_response(reply.status)
        for name, value in reply.wire_headers().items():
            self.send_header(name, value)
        recorded.headers_sent_ns = time.perf_counter_ns()
        self.end_headers()
        for pause, chunk in reply.writes():
            if not self._pause(pause):
                self.close_connection = True
                return
            recorded.chunks_sent_ns.append(time.perf_counter_ns())
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if reply.streamed else chunk)
        if reply.truncated:
            self.close_connection = True
        elif reply.streamed:
            self.wfile.write(b"0\r\n\r\n")

    def _pause(self, seconds: float) -> bool:
        """Sleep unless the server is closing; False means stop replying."""
        return seconds <= 0 or not self.server.closing.wait(seconds)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the per-request access log off stderr."""


class LoopbackServer:
    """A threaded HTTP/1.1 server on 127.0.0.1 (ephemeral port) serving `replies` for any POST or GET path.

    Use it as a context manager: leaving it stops accepting, interrupts pauses, disconnects open keep-alive
    connections and joins every thread.
    """

    def __init__(self, replies: ReplySource = ()) -> None:
        self._recorder = Recorder(replies)
        self._server = _HTTPServer(self._recorder)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, name="wire-loopback"
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        """openai's `base_url`, e.g. "http://127.0.0.1:54321/v1"."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        return self._recorder.requests

    @property
    def pending(self) -> int:
        return self._recorder.pending

    def push(self, *replies: Reply) -> None:
        self._recorder.push(*replies)

    def close(self) -> None:
        self._server.closing.set()
        self._server.shutdown()
        self._server.disconnect_all()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
