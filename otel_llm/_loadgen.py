"""The load generator behind ``otel-llm demo`` and ``otel-llm bench``: streamed chat completions through the real
``openai.AsyncOpenAI`` client, closed loop (each of ``concurrency`` workers sends its next request when the last
one finished), so the in-flight count is the concurrency level.

It measures nothing itself beyond counts and wall time: latencies come from the metrics otel_llm records for
these calls. A request that fails is counted under its exception's class name and the level goes on (where the
load generator ends a request itself, on a malformed chunk or at the timeout, otel_llm's ``error.type`` can only say
``cancelled``); `preflight` sends one request first and turns the failures that would fail every request (wrong
URL, key, model, not an OpenAI stream) into an `EndpointProblem` with a one-line message saying what to fix.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx2
import openai

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionUserMessageParam

# prompt filler: about 4 characters per token, the usual English rate (and the simulator's chars_per_token)
_CHARS_PER_TOKEN = 4
_FILLER = "Measure the time to first token and the time per output token of this streamed answer. "


class EndpointProblem(Exception):
    """The endpoint cannot serve this workload; the message is one line that says what to fix."""


class MalformedStream(Exception):
    """A stream event that is JSON but not a chat-completion chunk."""


# failures that end a request but not the run; anything else is a bug and propagates. The openai client decodes
# event lines as UTF-8 without catching the error, so a server's invalid bytes arrive as UnicodeDecodeError.
REQUEST_FAILURES: tuple[type[Exception], ...] = (openai.OpenAIError, json.JSONDecodeError, UnicodeDecodeError,
                                                 MalformedStream)


@dataclass(frozen=True, slots=True)
class Workload:
    """What every request asks for, and how long each may take, streamed answer included. ``max_tokens`` None
    leaves the output length to the server."""

    model: str
    prompt_tokens: int
    max_tokens: int | None
    timeout_s: float
    # distinct per run and request, so a server's prefix cache cannot answer from an earlier run
    nonce: str = field(default_factory=lambda: secrets.token_hex(4))

    def messages(self, index: int) -> list[ChatCompletionUserMessageParam]:
        head = f"[run {self.nonce} request {index}] "
        chars = max(self.prompt_tokens * _CHARS_PER_TOKEN - len(head), 0)
        body = (_FILLER * (chars // len(_FILLER) + 1))[:chars]
        return [{"role": "user", "content": head + body}]


@dataclass(slots=True)
class LevelRun:
    """Counts and wall time of one level, updated as requests finish (so an interrupted level keeps its part)."""

    concurrency: int
    planned: int
    started_ns: int = 0
    ended_ns: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        return self.ok + sum(self.errors.values())

    @property
    def elapsed_s(self) -> float:
        end = self.ended_ns or time.perf_counter_ns()
        return (end - self.started_ns) / 1e9 if self.started_ns else 0.0


async def stream_one(client: openai.AsyncOpenAI, workload: Workload, index: int) -> int:
    """Send one streamed chat completion and read it to the end; return the chunks that carried content. Raise
    `openai.APITimeoutError` when the whole of it takes longer than ``workload.timeout_s``: the client's own timeouts
    bound each read only, so a server that trickles its answer would never trip them."""
    try:
        async with asyncio.timeout(workload.timeout_s):
            stream = await client.chat.completions.create(
                model=workload.model, messages=workload.messages(index), stream=True,
                max_tokens=openai.omit if workload.max_tokens is None else workload.max_tokens,
            )
            content = 0
            async with stream:
                async for chunk in stream:
                    content += _carries_content(chunk)
    except TimeoutError as exc:
        request = httpx2.Request("POST", client.base_url.join("chat/completions"))
        raise openai.APITimeoutError(request) from exc
    return content


def _carries_content(chunk: object) -> bool:
    """Whether a chunk carries output text. Servers send JSON the client does not validate, so check the shape."""
    choices = getattr(chunk, "choices", None)
    if not isinstance(choices, list):
        raise MalformedStream("an event without a list of choices")
    deltas = [getattr(choice, "delta", None) for choice in choices]
    if any(delta is None for delta in deltas):
        raise MalformedStream("a choice without a delta")
    return any(getattr(delta, "content", None) for delta in deltas)


async def run_level(
    client: openai.AsyncOpenAI,
    workload: Workload,
    run: LevelRun,
    *,
    first_index: int = 0,
    max_seconds: float | None = None,
    on_progress: Callable[[LevelRun], None] | None = None,
) -> None:
    """Send ``run.planned`` requests from ``run.concurrency`` workers; stop issuing new ones after
    ``max_seconds`` (those in flight finish). Cancellation (Ctrl-C) cancels the requests in flight."""
    issued = 0
    deadline_ns = None if max_seconds is None else time.perf_counter_ns() + int(max_seconds * 1e9)

    async def worker() -> None:
        nonlocal issued
        while issued < run.planned and (deadline_ns is None or time.perf_counter_ns() < deadline_ns):
            index = first_index + issued
            issued += 1
            try:
                await stream_one(client, workload, index)
            except REQUEST_FAILURES as exc:
                name = type(exc).__name__
                run.errors[name] = run.errors.get(name, 0) + 1
            else:
                run.ok += 1
            if on_progress is not None:
                on_progress(run)

    run.started_ns = time.perf_counter_ns()
    try:
        await asyncio.gather(*(worker() for _ in range(min(run.concurrency, run.planned))))
    finally:
        run.ended_ns = time.perf_counter_ns()


async def preflight(client: openai.AsyncOpenAI, workload: Workload, base_url: str) -> None:
    """One request, read to the end: raise `EndpointProblem` for what would fail every request."""
    try:
        content = await stream_one(client, workload, -1)
    except openai.APITimeoutError as exc:
        raise EndpointProblem(
            f"no complete answer from {base_url} within the timeout; check --base-url, or raise --timeout for a slow "
            "server"
        ) from exc
    except openai.APIConnectionError as exc:
        raise EndpointProblem(_connection_problem(exc, base_url)) from exc
    except openai.AuthenticationError as exc:
        raise EndpointProblem(
            f"{base_url} rejected the API key (401: {_message(exc)}); pass --api-key or set OPENAI_API_KEY"
        ) from exc
    except openai.PermissionDeniedError as exc:
        raise EndpointProblem(
            f"{base_url} refused access (403: {_message(exc)}); check that the API key may use {workload.model!r}"
        ) from exc
    except openai.NotFoundError as exc:
        if exc.code == "model_not_found" or "model" in _message(exc).lower():
            raise EndpointProblem(
                f"{base_url} does not serve model {workload.model!r} (404: {_message(exc)}); check --model"
            ) from exc
        raise EndpointProblem(
            f"{base_url}/chat/completions was not found (404); check --base-url (it usually ends in /v1)"
        ) from exc
    except openai.RateLimitError as exc:
        raise EndpointProblem(
            f"{base_url} is rate limiting already (429: {_message(exc)}); wait, or use a key with a higher limit"
        ) from exc
    except openai.BadRequestError as exc:
        raise EndpointProblem(
            f"{base_url} rejected the request (400: {_message(exc)}); check --model, --max-tokens, --prompt-tokens"
        ) from exc
    except openai.APIStatusError as exc:
        raise EndpointProblem(f"{base_url} answered {exc.status_code}: {_message(exc)}") from exc
    except (openai.APIError, json.JSONDecodeError, UnicodeDecodeError, MalformedStream) as exc:
        raise EndpointProblem(
            f"{base_url} sent a malformed stream ({_oneline(exc)}); check that --base-url is an OpenAI-compatible "
            "endpoint that streams chat completions"
        ) from exc
    if content == 0:
        raise EndpointProblem(
            f"{base_url} answered with a stream that carried no content; check that --base-url is an "
            "OpenAI-compatible endpoint that streams chat completions"
        )


def _connection_problem(exc: openai.APIConnectionError, base_url: str) -> str:
    """A connection that could not be made, or one that broke once made; named by the URL it went to, which a
    redirect may have moved away from ``base_url``."""
    cause = exc.__cause__
    detail = f" ({_oneline(cause)})" if cause is not None and str(cause) else ""
    url = base_url
    if isinstance(cause, httpx2.RequestError):
        with suppress(RuntimeError):  # an httpx error raised without its request
            reached = str(cause.request.url)
            if not reached.startswith(base_url):
                url = f"{reached} (where {base_url} redirected)"
    if isinstance(cause, httpx2.ConnectError):
        return f"cannot connect to {url}{detail}; check --base-url and that the server is running"
    return (f"{url} accepted the connection, but its answer broke off or could not be decoded{detail}; check the "
            "server's log, or a proxy's in between")


def _message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return _oneline(body["message"])
    return _oneline(exc.message)


def _oneline(value: object, limit: int = 160) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_client(base_url: str, api_key: str, concurrency: int, timeout: float) -> openai.AsyncOpenAI:
    """The client under test: no retries, so every 429 and failure is seen, and a kept-alive connection per worker
    (openai's default pool keeps only 100)."""
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key, max_retries=0, timeout=openai.Timeout(timeout, connect=min(timeout, 10.0)),
        http_client=openai.DefaultAsyncHttpxClient(limits=limits),
    )
