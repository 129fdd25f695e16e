"""The wire fakes, checked against the real openai client: it parses every body, feels every pause and failure."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Literal

import openai
import pytest
import wire
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

TRANSPORTS = ["in-process", "loopback"]
MESSAGES = [{"role": "user", "content": "Hi"}]
USAGE = wire.Usage(input=12, output=3, cached=4, reasoning=1)
TOLERANCE_NS = 2_000_000  # a client sees each server write within 2 ms
MS = 1_000_000


@contextmanager
def openai_client(transport: str, *replies: wire.Reply) -> Iterator[tuple[openai.OpenAI, list[wire.RecordedRequest]]]:
    """The real client over one of the two fakes, and the requests that fake records."""
    if transport == "in-process":
        http, recorder = wire.mock_client(replies)
        with openai.OpenAI(api_key="sk-test", http_client=http, max_retries=0) as client:
            yield client, recorder.requests
    else:
        with (
            wire.LoopbackServer(replies) as server,
            openai.OpenAI(api_key="sk-test", base_url=server.base_url, max_retries=0) as client,
        ):
            yield client, server.requests


@asynccontextmanager
async def async_openai_client(
    transport: str, *replies: wire.Reply
) -> AsyncIterator[tuple[openai.AsyncOpenAI, list[wire.RecordedRequest]]]:
    if transport == "in-process":
        http, recorder = wire.mock_client(replies, async_=True)
        async with openai.AsyncOpenAI(api_key="sk-test", http_client=http, max_retries=0) as client:
            yield client, recorder.requests
    else:
        with wire.LoopbackServer(replies) as server:
            async with openai.AsyncOpenAI(api_key="sk-test", base_url=server.base_url, max_retries=0) as client:
                yield client, server.requests


@pytest.fixture(autouse=True)
def no_server_tracebacks(capfd: pytest.CaptureFixture[str]) -> Iterator[None]:
    """The fakes stay quiet whatever the client does (socketserver prints a handler's uncaught errors)."""
    yield
    assert "Traceback" not in capfd.readouterr().err


def stream_chat(client: openai.OpenAI, **kwargs: object) -> list[ChatCompletionChunk]:
    return list(client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True, **kwargs))


# --- the HTTP library ------------------------------------------------------------------------------------------


def test_http_module_is_the_one_the_installed_openai_runs_on() -> None:
    with openai.OpenAI(api_key="sk-test") as client:
        assert isinstance(client._client, wire.http_module().Client)
    assert wire.http_module().__name__ == "httpx2"  # openai 3.x


# --- chat completions ------------------------------------------------------------------------------------------


def test_chat_stream_is_openai_sse_byte_for_byte() -> None:
    events = wire.chat_stream(["Hi"])

    assert events[0] == (
        b'data: {"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1735689600,'
        b'"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0ba0d124f1",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,'
        b'"finish_reason":null}],"obfuscation":"Xq3k"}\n\n'
    )
    assert events[-1] == b"data: [DONE]\n\n"
    assert len(events) == 4  # opening, "Hi", finish, [DONE]
    assert not any(b'"usage"' in event for event in events)  # usage only when the request asked for it


def test_chat_stream_opens_with_a_role_only_chunk_and_ends_with_a_usage_only_chunk() -> None:
    reply = wire.Reply.stream(wire.chat_stream(["Hel", "lo"], usage=USAGE))
    with openai_client("in-process", reply) as (client, _):
        opening, *tokens, finish, totals = stream_chat(client, stream_options={"include_usage": True})

    assert all(isinstance(chunk, ChatCompletionChunk) for chunk in [opening, *tokens, finish, totals])
    assert opening.choices[0].delta.role == "assistant"
    assert opening.choices[0].delta.content == ""
    assert [chunk.choices[0].delta.content for chunk in tokens] == ["Hel", "lo"]
    assert finish.choices[0].delta.content is None
    assert finish.choices[0].finish_reason == "stop"
    assert opening.usage is None
    assert totals.choices == []
    assert totals.usage is not None
    assert (totals.usage.prompt_tokens, totals.usage.completion_tokens, totals.usage.total_tokens) == (12, 3, 15)
    assert totals.usage.prompt_tokens_details is not None
    assert totals.usage.prompt_tokens_details.cached_tokens == 4
    assert totals.usage.completion_tokens_details is not None
    assert totals.usage.completion_tokens_details.reasoning_tokens == 1
    assert {chunk.id for chunk in [opening, *tokens, finish, totals]} == {"chatcmpl-abc"}
    assert totals.model == "gpt-4o-mini-2024-07-18"


def test_chat_stream_helper_accumulates_text_and_usage() -> None:
    reply = wire.Reply.stream(wire.chat_stream(["Hel", "lo"], usage=USAGE))
    with (
        openai_client("in-process", reply) as (client, _),
        client.chat.completions.stream(
            model="gpt-4o-mini", messages=MESSAGES, stream_options={"include_usage": True}
        ) as stream,
    ):
        final = stream.get_final_completion()

    assert final.choices[0].message.content == "Hello"
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is not None
    assert final.usage.total_tokens == 15


def test_tool_call_stream_streams_arguments_and_finishes_with_tool_calls() -> None:
    tool = {"type": "function", "function": {"name": wire.TOOL_NAME, "parameters": {"type": "object"}}}
    reply = wire.Reply.stream(wire.chat_stream(['{"city"', ':"Paris"}'], tool_call=True))
    with (
        openai_client("in-process", reply) as (client, _),
        client.chat.completions.stream(model="gpt-4o-mini", messages=MESSAGES, tools=[tool]) as stream,
    ):
        final = stream.get_final_completion()

    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_abc", "get_weather", '{"city":"Paris"}')


def test_chat_completion_body_parses() -> None:
    reply = wire.Reply.json(wire.chat_completion_body("Hello", usage=USAGE))
    with openai_client("in-process", reply) as (client, _):
        completion = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)

    assert isinstance(completion, ChatCompletion)
    assert completion.choices[0].message.content == "Hello"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens_details is not None
    assert (completion.usage.prompt_tokens, completion.usage.prompt_tokens_details.cached_tokens) == (12, 4)


def test_sse_error_event_mid_stream_raises_api_error() -> None:
    events = [*wire.chat_stream(["Hel"])[:2], wire.sse_error_event("The server had an error")]
    with openai_client("in-process", wire.Reply.stream(events)) as (client, _):
        received = []
        with pytest.raises(openai.APIError) as caught:
            received.extend(client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True))

    assert type(caught.value) is openai.APIError
    assert caught.value.message == "The server had an error"
    assert caught.value.body == {
        "message": "The server had an error",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert len(received) == 2


# --- responses -------------------------------------------------------------------------------------------------


def test_responses_stream_parses_into_typed_events_numbered_in_order() -> None:
    reply = wire.Reply.stream(wire.responses_stream(["Hel", "lo"], usage=USAGE))
    with openai_client("in-process", reply) as (client, _):
        events = list(client.responses.create(model="gpt-4o-mini", input="Hi", stream=True))

    assert [type(event) for event in events] == [
        ResponseCreatedEvent,
        ResponseInProgressEvent,
        ResponseOutputItemAddedEvent,
        ResponseContentPartAddedEvent,
        ResponseTextDeltaEvent,
        ResponseTextDeltaEvent,
        ResponseTextDoneEvent,
        ResponseContentPartDoneEvent,
        ResponseOutputItemDoneEvent,
        ResponseCompletedEvent,
    ]
    assert [event.sequence_number for event in events] == list(range(10))
    assert [event.delta for event in events if isinstance(event, ResponseTextDeltaEvent)] == ["Hel", "lo"]
    created, completed = events[0], events[-1]
    assert isinstance(created, ResponseCreatedEvent)
    assert (created.response.status, created.response.usage) == ("in_progress", None)
    assert isinstance(completed, ResponseCompletedEvent)
    assert completed.response.status == "completed"
    assert completed.response.model == "gpt-4o-mini-2024-07-18"
    usage = completed.response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (12, 3, 15)
    assert (usage.input_tokens_details.cached_tokens, usage.output_tokens_details.reasoning_tokens) == (4, 1)


def test_responses_stream_helper_builds_the_final_response() -> None:
    reply = wire.Reply.stream(wire.responses_stream(["Hel", "lo"], usage=USAGE))
    with (
        openai_client("in-process", reply) as (client, _),
        client.responses.stream(model="gpt-4o-mini", input="Hi") as stream,
    ):
        final = stream.get_final_response()

    assert final.output_text == "Hello"
    assert final.usage is not None
    assert final.usage.output_tokens == 3


def test_response_body_parses() -> None:
    with openai_client("in-process", wire.Reply.json(wire.response_body("Hello", usage=USAGE))) as (client, _):
        response = client.responses.create(model="gpt-4o-mini", input="Hi")

    assert isinstance(response, Response)
    assert (response.id, response.status, response.output_text) == ("resp_abc", "completed", "Hello")
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == 4


# --- legacy completions and embeddings -------------------------------------------------------------------------


def test_completion_stream_parses_with_usage_only_last_chunk() -> None:
    reply = wire.Reply.stream(wire.completion_stream(["Hel", "lo"], usage=USAGE))
    with openai_client("in-process", reply) as (client, _):
        chunks = list(
            client.completions.create(
                model="gpt-3.5-turbo-instruct", prompt="Hi", stream=True, stream_options={"include_usage": True}
            )
        )

    assert all(isinstance(chunk, Completion) for chunk in chunks)
    assert [chunk.choices[0].text for chunk in chunks[:3]] == ["Hel", "lo", ""]
    assert chunks[2].choices[0].finish_reason == "stop"
    assert chunks[3].choices == []
    assert chunks[3].usage is not None
    assert chunks[3].usage.total_tokens == 15


def test_completion_body_parses() -> None:
    with openai_client("in-process", wire.Reply.json(wire.completion_body("Hello", usage=USAGE))) as (client, _):
        completion = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Hi")

    assert completion.choices[0].text == "Hello"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3


@pytest.mark.parametrize("encoding_format", ["base64", "float"])
def test_embedding_body_parses_in_the_format_openai_asked_for(encoding_format: Literal["base64", "float"]) -> None:
    # openai requests base64 unless the caller names a format, and decodes it back to floats.
    body = wire.embedding_body(2, dims=4, usage_prompt_tokens=5, encoding_format=encoding_format)
    with openai_client("in-process", wire.Reply.json(body)) as (client, requests):
        if encoding_format == "float":
            result = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"], encoding_format="float")
        else:
            result = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])

    assert requests[0].json["encoding_format"] == encoding_format
    assert isinstance(result, CreateEmbeddingResponse)
    assert [item.embedding for item in result.data] == [wire.embedding_vector(0, 4), wire.embedding_vector(1, 4)]
    assert (result.usage.prompt_tokens, result.usage.total_tokens) == (5, 5)
    if encoding_format == "base64":
        assert len(base64.b64decode(body["data"][0]["embedding"])) == 4 * 4  # float32


# --- recorded requests and scripts -----------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_request_is_recorded(transport: str) -> None:
    replies = [wire.Reply.stream(wire.chat_stream(["Hi"])), wire.Reply.json(wire.chat_completion_body("Hi"))]
    with openai_client(transport, *replies) as (client, requests):
        stream_chat(client, temperature=0)
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)

    assert [(r.method, r.path) for r in requests] == [("POST", "/v1/chat/completions")] * 2
    assert requests[0].json == {"messages": MESSAGES, "model": "gpt-4o-mini", "stream": True, "temperature": 0}
    assert requests[0].headers["authorization"] == "Bearer sk-test"
    assert requests[0].headers["content-type"] == "application/json"
    assert "stream" not in requests[1].json


def test_loopback_keeps_connections_alive_but_a_sync_stream_costs_openai_its_connection() -> None:
    # openai's sync Stream stops reading at [DONE]; the unread end of the chunked body makes the pool drop it.
    replies = [wire.Reply.stream(wire.chat_stream(["Hi"])), *[wire.Reply.json(wire.chat_completion_body("Hi"))] * 2]
    with openai_client("loopback", *replies) as (client, requests):
        stream_chat(client)
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)

    first, second, third = (request.client_port for request in requests)
    assert first != second == third


async def test_an_async_stream_drains_the_body_and_keeps_the_connection() -> None:
    replies = [wire.Reply.stream(wire.chat_stream(["Hi"])) for _ in range(2)]
    async with async_openai_client("loopback", *replies) as (client, requests):
        for _ in replies:
            stream = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
            async for _chunk in stream:
                pass

    assert requests[0].client_port == requests[1].client_port


def test_a_function_can_choose_each_reply() -> None:
    def reply_for(request: wire.RecordedRequest) -> wire.Reply:
        return wire.Reply.json(wire.chat_completion_body(f"you asked {request.json['model']}"))

    http, recorder = wire.mock_client(reply_for)
    with openai.OpenAI(api_key="sk-test", http_client=http, max_retries=0) as client:
        completion = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES)

    assert completion.choices[0].message.content == "you asked gpt-4.1"
    assert len(recorder.requests) == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_request_beyond_the_script_fails_loudly(transport: str) -> None:
    with openai_client(transport) as (client, _), pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)

    assert caught.value.status_code == 418
    assert "wire: no reply queued for POST /v1/chat/completions" in caught.value.message


def test_pushed_replies_are_served_after_the_initial_ones() -> None:
    with wire.LoopbackServer([wire.Reply.json(wire.chat_completion_body("one"))]) as server:
        server.push(wire.Reply.json(wire.chat_completion_body("two")))
        assert server.pending == 2
        with openai.OpenAI(api_key="sk-test", base_url=server.base_url, max_retries=0) as client:
            texts = [
                client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content for _ in "ab"
            ]

    assert texts == ["one", "two"]
    assert server.pending == 0


# --- failures as the client sees them --------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rate_limited_reply_raises_rate_limit_error_with_openai_headers(transport: str) -> None:
    reply = wire.Reply.rate_limited(retry_after=2)
    with openai_client(transport, reply) as (client, _), pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)

    error = caught.value
    assert error.status_code == 429
    assert error.code == "rate_limit_exceeded"
    assert error.response.headers["retry-after"] == "2"
    assert error.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.response.headers["x-ratelimit-limit-tokens"] == "200000"
    assert set(wire.openai_ratelimit_headers(1, 0, 1, 0)) <= set(error.response.headers)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_drop_after_cuts_the_stream_with_api_connection_error(transport: str) -> None:
    reply = wire.Reply.stream(wire.chat_stream(["Hel", "lo"]), drop_after=2)
    received: list[ChatCompletionChunk] = []
    with openai_client(transport, reply) as (client, _), pytest.raises(openai.APIConnectionError) as caught:
        received.extend(client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True))

    assert type(caught.value) is openai.APIConnectionError
    assert type(caught.value.__cause__) is wire.http_module().RemoteProtocolError
    assert str(caught.value.__cause__) == (
        "peer closed connection without sending complete message body (incomplete chunked read)"
    )
    assert [chunk.choices[0].delta.content for chunk in received] == ["", "Hel"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_drop_after_cuts_an_async_stream_too(transport: str) -> None:
    reply = wire.Reply.stream(wire.chat_stream(["Hel", "lo"]), drop_after=2)
    async with async_openai_client(transport, reply) as (client, _):
        stream = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIConnectionError) as caught:
            async for _ in stream:
                pass

    assert type(caught.value.__cause__) is wire.http_module().RemoteProtocolError


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_drop_before_a_json_body_fails_the_call(transport: str) -> None:
    reply = wire.Reply(body=wire.chat_completion_body("Hi"), drop_after=0)
    with openai_client(transport, reply) as (client, _), pytest.raises(openai.APIConnectionError) as caught:
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)

    assert str(caught.value.__cause__).startswith(
        "peer closed connection without sending complete message body (received 0 bytes, expected "
    )


# --- timing ----------------------------------------------------------------------------------------------------

# Scheduler noise on a busy machine only ever adds lag, so a measurement gets a few attempts; a systematic lag
# fails them all. Causality and the server's pauses are checked on every attempt.
ATTEMPTS = 5


def paused_replies() -> list[wire.Reply]:
    """A warm-up stream (a process's first parse costs the client a few ms of one-time setup), then per attempt:
    20 ms to the headers, 10 ms more to the role chunk, 0 to the first token, 5 ms to the second."""
    paused = wire.Reply.stream(wire.chat_stream(["Hel", "lo"]), headers_delay=0.02, delays=[0.01, 0.0, 0.005])
    return [wire.Reply.stream(wire.chat_stream(["Hi"])), *[paused] * ATTEMPTS]


def client_lags(request: wire.RecordedRequest, headers_ns: int, chunks_ns: list[int]) -> list[int]:
    """How far each client-side mark trails the server write it saw (headers, then each chunk)."""
    assert request.headers_sent_ns is not None
    assert request.headers_sent_ns - request.received_ns >= 20 * MS
    assert request.chunks_sent_ns[0] - request.headers_sent_ns >= 10 * MS
    assert request.chunks_sent_ns[2] - request.chunks_sent_ns[1] >= 5 * MS
    assert len(chunks_ns) == 4  # role, two tokens, finish; [DONE] ends the iteration
    lags = [headers_ns - request.headers_sent_ns]
    lags += [client - server for client, server in zip(chunks_ns, request.chunks_sent_ns, strict=False)]
    assert min(lags) >= 0
    return lags


@pytest.mark.timing  # each server write seen within 2 ms
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_client_sees_each_pause_as_the_server_timed_it(transport: str) -> None:
    with openai_client(transport, *paused_replies()) as (client, requests):
        stream_chat(client)
        for attempt in range(1, ATTEMPTS + 1):
            started_ns = time.perf_counter_ns()
            stream = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
            headers_ns = time.perf_counter_ns()
            chunks_ns = [time.perf_counter_ns() for _ in stream]
            assert started_ns < requests[attempt].received_ns
            lags = client_lags(requests[attempt], headers_ns, chunks_ns)
            if max(lags) < TOLERANCE_NS:
                break

    assert max(lags) < TOLERANCE_NS, f"lags in ns on every attempt, last: {lags}"


@pytest.mark.timing  # each server write seen within 2 ms
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_async_client_sees_each_pause_as_the_server_timed_it(transport: str) -> None:
    async with async_openai_client(transport, *paused_replies()) as (client, requests):
        async for _ in await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True):
            pass
        for attempt in range(1, ATTEMPTS + 1):
            stream = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
            headers_ns = time.perf_counter_ns()
            chunks_ns = [time.perf_counter_ns() async for _ in stream]
            lags = client_lags(requests[attempt], headers_ns, chunks_ns)
            if max(lags) < TOLERANCE_NS:
                break

    assert max(lags) < TOLERANCE_NS, f"lags in ns on every attempt, last: {lags}"


# --- loopback lifecycle ----------------------------------------------------------------------------------------


def test_client_leaving_mid_stream_is_quiet_and_the_server_still_stops() -> None:
    events = wire.chat_stream(["tok"] * 20)
    with wire.LoopbackServer([wire.Reply.stream(events, delays=[0.0] + [0.005] * (len(events) - 1))]) as server:
        with openai.OpenAI(api_key="sk-test", base_url=server.base_url, max_retries=0) as client:
            stream = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
            next(iter(stream))
            stream.close()
        time.sleep(0.03)  # the server writes into the closed connection

    assert len(server.requests[0].chunks_sent_ns) < len(events)


def test_loopback_stops_fast_despite_idle_and_paused_connections() -> None:
    threads_before = threading.active_count()
    slow = wire.Reply.stream(wire.chat_stream(["Hel", "lo"]), delays=[0.0, 10.0])
    server = wire.LoopbackServer([wire.Reply.json(wire.chat_completion_body("Hi")), slow])
    with (
        openai.OpenAI(api_key="sk-test", base_url=server.base_url, max_retries=0) as idle,
        openai.OpenAI(api_key="sk-test", base_url=server.base_url, max_retries=0) as streaming,
    ):
        idle.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)  # leaves a keep-alive connection
        stream = streaming.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
        next(iter(stream))  # the server now pauses 10 s before the next chunk

        closing_ns = time.perf_counter_ns()
        server.close()
        assert time.perf_counter_ns() - closing_ns < 200 * MS
        assert threading.active_count() == threads_before

        with pytest.raises(openai.APIConnectionError):
            list(stream)
