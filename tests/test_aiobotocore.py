"""aiobotocore's bedrock-runtime through otel_llm, at the wire: the loopback server of test_bedrock speaks Bedrock's
JSON and event-stream framing, and real aiobotocore (3.x, and 2.x, which aioboto3 is built on; over aiohttp, and over
httpx where its body is read) signs, sends, retries and parses. The same operations and the same spans as boto3's;
what the caller awaits and iterates is aiobotocore's own.

aiobotocore pins botocore to a release or two behind boto3's latest, so these tests run in venvs of their own
(.venv-aiobotocore with 2.x, .venv-3.13 with the latest, made by scripts/test); elsewhere tests/conftest.py leaves
this module out."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiobotocore.client
import aiobotocore.endpoint
import pytest
import wire
import wire_bedrock as wb
import wrapt
from aiobotocore.config import AioConfig
from aiobotocore.eventstream import AioEventStream
from aiobotocore.httpxsession import HttpxSession
from aiobotocore.response import HttpxStreamingBody, StreamingBody
from aiobotocore.session import get_session
from botocore.exceptions import EventStreamError
from conftest import Captured, Instrument, attributes
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import StatusCode
from test_bedrock import (
    CLAUDE,
    CONVERSE_STREAM,
    FIRST_DELAY,
    GAPS,
    HEADERS_DELAY,
    INPUT_TOKENS,
    INVOKE_CLAUDE_STREAM,
    LEAD_DELAY,
    MESSAGES,
    MODEL,
    PROMPT_CHARS,
    STREAM_CALLS,
    SYSTEM,
    TAIL_DELAY,
    TIMING_TOKENS,
    TIMING_USAGE,
    TOKENS,
    USAGE,
    Observation,
    StreamCall,
    assert_cancelled_after_the_first_token,
    assert_ended_by_the_exception_event,
    assert_read_to_its_end,
    content_gaps,
    identity,
    sdk_call,
    stream_ids,
)
from test_content import (  # the fixture too
    CONVERSE_MESSAGES,
    CONVERSE_TOOL_STREAM_CONTENT,
    converse_tool_stream,
    record,  # noqa: F401
)

import otel_llm
from otel_llm import _safety
from otel_llm import _semconv as sc
from otel_llm.providers import aiobotocore as aiobotocore_adapter
from otel_llm.providers import bedrock as bedrock_adapter

MS = 1e-3
# the session classes of its HTTP backends: httpx is 3.x's (2.x's, experimental, needs the old httpx package, and
# only aiohttp is tested there)
BACKENDS = {"aiohttp": None, **({"httpx": HttpxSession} if int(aiobotocore.__version__.split(".")[0]) >= 3 else {})}


def response_of(body: Any) -> Any:
    """The response an aiobotocore body reads: 3.x's body holds it, 2.x's is a proxy of it."""
    return body.__wrapped__ if isinstance(body, wrapt.ObjectProxy) else body.raw_stream


async def outcome(step: Any) -> Any:
    """What a step of the caller's gives, awaited when it is a coroutine, or how it fails."""
    try:
        result = step()
        return await result if asyncio.iscoroutine(result) else result
    except Exception as error:
        return type(error), str(error)


@contextlib.asynccontextmanager
async def bedrock(replies: wire.ReplySource, *, attempts: int = 1, backend: str = "aiohttp",
                  service: str = "bedrock-runtime") -> AsyncIterator[tuple[Any, wire.LoopbackServer]]:
    """An aiobotocore client on a loopback server answering with ``replies``: dummy credentials, so requests are
    signed as usual; ``attempts`` bounds the standard retry mode (1: no retries)."""
    session_class = BACKENDS[backend]
    config = AioConfig(retries={"total_max_attempts": attempts, "mode": "standard"},
                       **({"http_session_cls": session_class} if session_class else {}))
    with wire.LoopbackServer(replies) as server:
        async with get_session().create_client(
                service, endpoint_url=wb.endpoint_url(server), region_name=wb.REGION, aws_access_key_id="test",
                aws_secret_access_key="test", config=config) as client:
            yield client, server


async def consume(call: StreamCall, client: Any) -> list[dict[str, Any]]:
    response = await call.start(client)
    return [event async for event in response[call.key]]


# --- one span per call, as boto3's --------------------------------------------------------------------------------


async def test_converse_is_one_span_with_usage_and_bedrocks_own_latency(otel: Captured) -> None:
    reply = wb.converse_reply(wb.converse_body("Hello", usage=USAGE, latency_ms=120))
    async with bedrock([reply]) as (client, server):
        response = await client.converse(modelId=MODEL, system=SYSTEM, messages=MESSAGES,
                                         inferenceConfig={"maxTokens": 50, "temperature": 0.2})
    assert response["output"]["message"]["content"] == [{"text": "Hello"}]

    span = otel.span()
    assert span.name == f"chat {MODEL}" and span.status.status_code is StatusCode.UNSET
    attrs = dict(attributes(span))
    assert attrs.pop(sc.TIME_TO_HEADERS) > 0
    assert attrs == {
        **identity(server),
        sc.REQUEST_STREAM: False,
        sc.PROMPT_LENGTH: PROMPT_CHARS,
        sc.REQUEST_MAX_TOKENS: 50,
        sc.REQUEST_TEMPERATURE: 0.2,
        sc.RESPONSE_FINISH_REASONS: ("end_turn",),
        sc.USAGE_INPUT_TOKENS: INPUT_TOKENS,
        sc.USAGE_OUTPUT_TOKENS: 3,
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 4,
        sc.USAGE_CACHE_CREATION_INPUT_TOKENS: 2,
        sc.PROVIDER_LATENCY: 0.12,
        **sdk_call("Converse"),
        sc.AWS_REQUEST_ID: wb.REQUEST_ID,
    }
    duration = otel.point(sc.STABLE_NAMES.duration.name)
    assert dict(duration.attributes) == {**identity(server), sc.REQUEST_STREAM: False, sc.PROMPT_SIZE: "<1k"}
    assert duration.count == 1
    usage_name = sc.STABLE_NAMES.token_usage.name  # type: ignore[union-attr]
    assert otel.point(usage_name, gen_ai__token__type="input").sum == INPUT_TOKENS


async def test_converse_stream_is_one_span_with_ttft_usage_and_bedrocks_own_latency(otel: Captured) -> None:
    reply = wb.stream_reply(wb.converse_stream(TOKENS, usage=USAGE, latency_ms=90), headers_delay=0.02,
                            delays=[0.01, 0.03, 0.01, 0.01])
    async with bedrock([reply]) as (client, server):
        response = await client.converse_stream(modelId=MODEL, system=SYSTEM, messages=MESSAGES)
        assert isinstance(response["stream"], AioEventStream)
        received = [event async for event in response["stream"]]
    assert [next(iter(event)) for event in received] == [
        "messageStart", "contentBlockDelta", "contentBlockDelta", "contentBlockDelta", "contentBlockStop",
        "messageStop", "metadata"]

    span = otel.span()
    attrs = dict(attributes(span))
    timings = {key: attrs.pop(key) for key in (sc.RESPONSE_TIME_TO_FIRST_CHUNK, sc.MAX_CHUNK_GAP,
                                                 sc.TIME_PER_OUTPUT_TOKEN, sc.TIME_TO_HEADERS)}
    assert attrs == {
        **identity(server),
        sc.REQUEST_STREAM: True,
        sc.PROMPT_LENGTH: PROMPT_CHARS,
        sc.RESPONSE_FINISH_REASONS: ("end_turn",),
        sc.USAGE_INPUT_TOKENS: INPUT_TOKENS,
        sc.USAGE_OUTPUT_TOKENS: 3,
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 4,
        sc.USAGE_CACHE_CREATION_INPUT_TOKENS: 2,
        sc.CONTENT_CHUNKS: 3,
        sc.PROVIDER_LATENCY: 0.09,
        **sdk_call("ConverseStream"),
        sc.AWS_REQUEST_ID: wb.REQUEST_ID,
    }
    # the headers after 20 ms; messageStart (no token) 10 ms later, the first token 30 ms after that
    assert timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK] >= 0.06
    assert 0.02 <= timings[sc.TIME_TO_HEADERS] < timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK]
    gaps = otel.point(sc.STABLE_NAMES.time_per_output_chunk.name)
    assert gaps.count == 2 and gaps.sum == pytest.approx(2 * timings[sc.TIME_PER_OUTPUT_TOKEN], abs=1e-6)
    assert otel.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


@pytest.mark.parametrize("backend", list(BACKENDS))
async def test_invoke_model_reads_the_body_within_the_call(otel: Captured, backend: str) -> None:
    reply = wb.invoke_reply(CLAUDE.body(TOKENS, USAGE), wb.invocation_headers(USAGE, latency_ms=70))
    async with bedrock([reply], backend=backend) as (client, server):
        response = await client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Say hello")))
        body = await response["body"].read()
    assert json.loads(body) == CLAUDE.body(TOKENS, USAGE)
    attrs = attributes(otel.span())
    assert {key: attrs[key] for key in identity(server)} == identity(server)
    assert attrs[sc.USAGE_INPUT_TOKENS] == INPUT_TOKENS and attrs[sc.USAGE_OUTPUT_TOKENS] == 3
    assert attrs[sc.RESPONSE_ID] == wb.CLAUDE_ID and attrs[sc.RESPONSE_FINISH_REASONS] == ("end_turn",)
    assert attrs[sc.PROVIDER_LATENCY] == 0.07
    assert attrs[sc.RPC_METHOD] == "InvokeModel"


@pytest.mark.parametrize("backend", list(BACKENDS))
async def test_invoke_models_body_keeps_aiobotocores_behaviour(instrument: Instrument, backend: str) -> None:
    """We read the body within the call and hand over one of aiobotocore's own class that replays it: it reads in
    pieces, iterates, closes, is a context manager and keeps the header's length as the one we read."""
    async def use(client: Any) -> list[Any]:
        body = (await client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi"))))["body"]

        async def chunks() -> list[bytes]:
            return [chunk async for chunk in body.iter_chunks(64)]

        # readable() fails in 2.x, which asks the response for a method only its content has: with us too
        length = getattr(body, "_self_content_length", None) or getattr(body, "_content_length", None)
        seen: list[Any] = [type(body), length, await outcome(body.readable), await body.read(5), body.tell(),
                           await chunks(), await body.read(), body.tell()]
        async with body as entered:  # closes it: a read after that fails as the backend's does
            seen.append(type(entered))
        seen.append(await outcome(body.read))
        return seen

    reply = wb.invoke_reply(CLAUDE.body(TOKENS, USAGE))
    async with bedrock([reply], backend=backend) as (client, _):
        without = await use(client)
    captured = instrument()
    async with bedrock([reply], backend=backend) as (client, _):
        assert await use(client) == without
    assert without[0] is {"aiohttp": StreamingBody, "httpx": HttpxStreamingBody}[backend]
    assert attributes(captured.span())[sc.USAGE_OUTPUT_TOKENS] == 3


RESPONSE_READS: dict[str, Any] = {
    "read()": lambda response: response.read(),
    "text()": lambda response: response.text(),
    "json()": lambda response: response.json(),
    "content.read()": lambda response: response.content.read(),
    "content.read(7), content.readany()": lambda response: _in_turn(response.content.read, 7,
                                                                     response.content.readany),
    "content.iter_chunked(64)": lambda response: _gathered(response.content.iter_chunked(64)),
    "content.at_eof()": lambda response: response.content.at_eof(),
}


async def _gathered(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


async def _in_turn(read: Any, size: int, read_any: Any) -> tuple[bytes, bytes]:
    return await read(size), await read_any()


@pytest.mark.parametrize("inside", [False, True], ids=["the body", "async with the body"])
@pytest.mark.parametrize("read", list(RESPONSE_READS))
async def test_the_aiohttp_response_a_body_reads_gives_its_bytes_as_without_us(
        instrument: Instrument, read: str, inside: bool) -> None:
    """Over aiohttp, what a caller reads of the response behind the body (2.x's body is a proxy of it, and ``async
    with`` 2.x's body gives it; 3.x's holds it): the same bytes, text and JSON as without us, inside ``async with``
    and after it (where aiohttp's released response fails a read), though we read them within the call."""
    async def use(client: Any) -> list[Any]:
        body = (await client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi"))))["body"]
        if not inside:
            return [await outcome(lambda: RESPONSE_READS[read](response_of(body)))]
        async with body as entered:
            response = entered if entered is not body else response_of(body)  # 2.x gives the response, 3.x itself
            seen = [type(response), await outcome(lambda: RESPONSE_READS[read](response))]
        seen.append(await outcome(lambda: RESPONSE_READS[read](response)))
        return seen

    reply = wb.invoke_reply(CLAUDE.body(TOKENS, USAGE))
    async with bedrock([reply]) as (client, _):
        without = await use(client)
    captured = instrument()
    async with bedrock([reply]) as (client, _):
        assert await use(client) == without
    assert attributes(captured.span())[sc.RESPONSE_ID] == wb.CLAUDE_ID


@pytest.mark.parametrize("backend", list(BACKENDS))
async def test_the_response_a_replayed_body_reads_is_the_callers_own_over_aiohttp(
        instrument: Instrument, backend: str) -> None:
    """Over aiohttp the body we hand over reads the real response, its content refilled. Over httpx it reads our
    stand-in, whose status and headers are the real response's, and a copy of which (looking attributes up before it
    has any) is made as a plain object's is."""
    instrument()
    reply = wb.invoke_reply(CLAUDE.body(TOKENS, USAGE))
    async with bedrock([reply], backend=backend) as (client, _):
        body = (await client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi"))))["body"]
        response = response_of(body)
        if backend == "aiohttp":
            assert type(response).__name__ == "ClientResponse" and response.status == 200
        else:
            assert type(response) is bedrock_adapter._AsyncReplay and response.status_code == 200
            assert copy.copy(response).url == response.url
        assert response.headers["content-type"] == "application/json"
        assert await body.read() == reply.body


async def test_a_body_cut_off_in_transfer_fails_at_read_as_without_us(instrument: Instrument) -> None:
    """The call returns; reading the body raises what aiobotocore raises without us (aiohttp's own payload error):
    the operation records that error."""
    sent = wb.invoke_reply(CLAUDE.body(TOKENS, USAGE))
    cut = wire.Reply(sent.status, sent.body, sent.headers, drop_after=0)

    async def read_cut_body() -> type[BaseException]:
        async with bedrock([cut]) as (client, _):
            body = (await client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi"))))["body"]
            with pytest.raises(Exception) as raised:
                await body.read()
        return type(raised.value)

    without = await read_cut_body()
    captured = instrument()
    assert await read_cut_body() is without
    captured.assert_finished(without.__name__)


async def test_a_body_we_cannot_replay_is_the_callers_unread(
        otel: Captured, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Should a release's body class or response not take our replay, we find out before reading: the body
    stays aiobotocore's own, unread, and the span has the token counts of Bedrock's headers."""
    monkeypatch.setattr(_safety, "strict", False)
    monkeypatch.setattr(_safety, "_reported", set())

    def refused(response: object) -> None:
        raise TypeError("a response of a release we have not seen")

    monkeypatch.setattr(bedrock_adapter, "_replaying", refused)
    reply = wb.invoke_reply(CLAUDE.body(TOKENS, USAGE), wb.invocation_headers(USAGE, latency_ms=70))
    async with bedrock([reply]) as (client, _):
        with caplog.at_level(logging.WARNING, logger="otel_llm"):
            body = (await client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi"))))["body"]
        assert type(response_of(body)).__name__ == "ClientResponse"
        assert await body.read() == reply.body
    assert [r.message for r in caplog.records] == [
        "otel_llm: internal failure in aiobotocore body; telemetry for this call is incomplete"]
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == USAGE.output and sc.RESPONSE_ID not in attrs  # the headers', not the body's


async def test_the_caller_gets_what_aiobotocore_gives_without_us(instrument: Instrument) -> None:
    async def calls(client: Any) -> list[Any]:
        converse = await client.converse(modelId=MODEL, messages=MESSAGES)
        stream = await client.converse_stream(modelId=MODEL, messages=MESSAGES)
        invoked = await client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi")))
        streamed = await client.invoke_model_with_response_stream(modelId=MODEL,
                                                                  body=json.dumps(CLAUDE.request("Hi")))
        results = [converse, stream, invoked, streamed]
        for result in results:
            result["ResponseMetadata"]["HTTPHeaders"].pop("date")
        return [converse, {**stream, "stream": [event async for event in stream["stream"]]},
                {**invoked, "body": await invoked["body"].read()},
                {**streamed, "body": [event async for event in streamed["body"]]}]

    def replies() -> list[wire.Reply]:
        return [wb.converse_reply(wb.converse_body("Hi", usage=USAGE, latency_ms=5)),
                wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None)),
                wb.invoke_reply(CLAUDE.body(TOKENS, USAGE), wb.invocation_headers(USAGE, latency_ms=9)),
                wb.stream_reply(INVOKE_CLAUDE_STREAM.events(TOKENS, USAGE, None))]

    async with bedrock(replies()) as (client, _):
        without = await calls(client)
    captured = instrument()
    async with bedrock(replies()) as (client, _):
        assert await calls(client) == without
    assert sorted(span.attributes[sc.RPC_METHOD] for span in captured.spans()) == [  # type: ignore[index]
        "Converse", "ConverseStream", "InvokeModel", "InvokeModelWithResponseStream"]


async def test_an_event_stream_closes_and_iterates_only_as_aiobotocores_own(instrument: Instrument) -> None:
    """AioEventStream is read with ``async for`` and closed synchronously; it is no async context manager and
    ``anext()`` does not step it: so with us."""
    async def use(client: Any) -> list[Any]:
        stream = (await CONVERSE_STREAM.start(client))["stream"]
        seen: list[Any] = [isinstance(stream, AioEventStream), repr(stream).split(" at ")[0]]
        with pytest.raises(TypeError) as raised:
            async with stream:
                pass
        seen.append(type(raised.value))
        with pytest.raises(TypeError):
            await anext(stream)
        seen.append(stream.close())  # None: not a coroutine to await
        return seen

    async with bedrock([wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]) as (client, _):
        without = await use(client)
    captured = instrument()
    async with bedrock([wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]) as (client, _):
        assert await use(client) == without
    captured.assert_finished(sc.ERROR_CANCELLED)  # closed before its end


async def test_content_is_captured_as_from_boto3_when_opted_in(record: Any) -> None:  # noqa: F811
    """test_content's converse_stream turns and streamed tool call, through aiobotocore: the same messages."""
    recorded = record()
    async with bedrock([wb.stream_reply(converse_tool_stream())]) as (client, _):
        response = await client.converse_stream(modelId="m", system=[{"text": "Be brief."}],
                                                messages=CONVERSE_MESSAGES)
        [event async for event in response["stream"]]
    assert recorded.content() == CONVERSE_TOOL_STREAM_CONTENT


# --- every way a stream finishes, exactly once ---------------------------------------------------------------------


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
async def test_exhausted_stream_finishes_without_error(otel: Captured, call: StreamCall) -> None:
    async with bedrock([wb.stream_reply(call.events(TOKENS, USAGE, None))]) as (client, _):
        response = await call.start(client)
        events = [event async for event in response[call.key]]
        response[call.key].close()  # closing after the end changes nothing
    assert len(events) == len(call.events(TOKENS, USAGE, None))
    assert_read_to_its_end(otel)


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
async def test_break_then_close_is_cancelled(otel: Captured, call: StreamCall) -> None:
    reply = wb.stream_reply(call.events(TOKENS, USAGE, None), delays=[0.0] * (call.leading + 1) + [0.01, 0.01])
    async with bedrock([reply]) as (client, _):
        stream = (await call.start(client))[call.key]
        async for event in stream:
            if call.is_content(event):
                break
        assert otel.spans() == []  # still open: the caller may come back to it
        stream.close()
    assert_cancelled_after_the_first_token(otel)


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
async def test_exception_event_mid_stream_passes_through_under_its_code(otel: Captured, call: StreamCall) -> None:
    error = wb.exception(call.exception_type, "The model stopped answering.")
    async with bedrock([wb.stream_reply(call.events(TOKENS[:2], USAGE, error))]) as (client, _):
        response = await call.start(client)
        received = []
        with pytest.raises(EventStreamError) as raised:
            async for event in response[call.key]:
                received.append(event)
    assert_ended_by_the_exception_event(otel, call, received, raised.value)


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
async def test_connection_lost_mid_stream_is_recorded_by_class_name(otel: Captured, call: StreamCall) -> None:
    reply = wb.stream_reply(call.events(TOKENS, USAGE, None), drop_after=call.leading + 2)
    async with bedrock([reply]) as (client, _):
        response = await call.start(client)
        with pytest.raises(Exception) as raised:
            [event async for event in response[call.key]]
    otel.assert_finished(type(raised.value).__name__)  # aiohttp's, as aiobotocore lets it through
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 2


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
async def test_a_cancelled_task_cancels_its_stream(otel: Captured, call: StreamCall) -> None:
    """asyncio cancels a request handler while it awaits the next event: the operation ends there, cancelled."""
    reply = wb.stream_reply(call.events(TOKENS, USAGE, None), delays=[0.0] * (call.leading + 1) + [1.0])
    async with bedrock([reply]) as (client, _):
        task = asyncio.create_task(consume(call, client))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    otel.assert_finished(sc.ERROR_CANCELLED)
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 1


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
async def test_abandoned_stream_finishes_when_collected(otel: Captured, call: StreamCall) -> None:
    reply = wb.stream_reply(call.events(TOKENS, USAGE, None), delays=[0.0] * call.leading + [0.02])
    async with bedrock([reply]) as (client, _):
        response = await call.start(client)
        events = aiter(response[call.key])
        for _ in range(call.leading + 1):  # up to the first token
            await anext(events)
        del response, events
        gc.collect()
        otel.assert_abandoned_at_first_token()


async def observe(call: StreamCall, client: Any) -> Observation:
    issued = time.perf_counter_ns()
    response = await call.start(client)
    arrivals = [(time.perf_counter_ns(), call.is_content(event)) async for event in response[call.key]]
    return issued, arrivals, time.perf_counter_ns()


@pytest.mark.usefixtures("steady_clock")
@pytest.mark.parametrize("call", [CONVERSE_STREAM, INVOKE_CLAUDE_STREAM], ids=stream_ids)
async def test_ttft_gaps_and_duration_match_the_callers_observation(otel: Captured, call: StreamCall) -> None:
    """Against the caller's own clock, read around each ``async for`` step, within 1 ms (test_bedrock's pauses)."""
    delays = [*([0.0] * call.leading), FIRST_DELAY, *GAPS, TAIL_DELAY]
    delays[0] = LEAD_DELAY
    reply = wb.stream_reply(call.events(TIMING_TOKENS, TIMING_USAGE, None), headers_delay=HEADERS_DELAY,
                            delays=delays)
    async with bedrock(lambda request: reply) as (client, _):
        await observe(call, client)  # warms the connection, aiobotocore's lazy loading and the SDK's aggregations
        issued, arrivals, ended = await observe(call, client)

    content = [t for t, is_content in arrivals if is_content]
    observed_ttft = (content[0] - issued) / 1e9
    observed_gaps = content_gaps(arrivals)
    span = otel.spans()[1]
    attrs = attributes(span)
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] == pytest.approx(observed_ttft, abs=MS)
    assert observed_ttft >= HEADERS_DELAY + LEAD_DELAY + FIRST_DELAY
    assert attrs[sc.MAX_CHUNK_GAP] == pytest.approx(max(observed_gaps), abs=MS)
    assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(sum(observed_gaps) / (len(TIMING_TOKENS) - 1), abs=MS)
    assert span.end_time is not None and span.start_time is not None
    recorded_duration = (span.end_time - span.start_time) / 1e9
    recorded_tail = recorded_duration - attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK]
    assert recorded_tail == pytest.approx((ended - content[0]) / 1e9, abs=MS)
    assert recorded_duration <= (ended - issued) / 1e9


# --- errors, other calls, and instrumenting --------------------------------------------------------------------


async def test_throttling_retries_stay_in_one_span_and_the_code_is_the_error_type(otel: Captured) -> None:
    async with bedrock([wb.throttled("first-attempt"), wb.throttled("last-attempt")], attempts=2) as (client, server):
        with pytest.raises(client.exceptions.ThrottlingException) as raised:
            await client.converse(modelId=MODEL, messages=MESSAGES)
        assert len(server.requests) == 2
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    attrs = attributes(otel.span())
    assert attrs[sc.ERROR_TYPE] == "ThrottlingException" and attrs[sc.RETRIES] == 1
    assert attrs[sc.AWS_REQUEST_ID] == "last-attempt"
    assert raised.value.__cause__ is None


async def test_error_responses_are_recorded_under_their_code(otel: Captured) -> None:
    async with bedrock([wb.error_reply(400, "ValidationException", "The model is not supported.")]) as (client, _):
        with pytest.raises(client.exceptions.ValidationException):
            await client.converse_stream(modelId=MODEL, messages=MESSAGES)
    otel.assert_finished("ValidationException")


async def test_other_services_and_operations_pass_through_untouched(otel: Captured) -> None:
    async with bedrock([wire.Reply.json({"modelSummaries": []})], service="bedrock") as (client, _):
        assert (await client.list_foundation_models())["modelSummaries"] == []
    async with bedrock([wire.Reply.json({"inputTokens": 7})]) as (client, _):
        counted = await client.count_tokens(modelId=MODEL, input={"converse": {"messages": MESSAGES}})
    assert counted["inputTokens"] == 7
    assert otel.spans() == []
    assert otel.points(sc.STABLE_NAMES.duration.name) == []


async def test_a_suppressed_call_gets_aiobotocores_own_objects(otel: Captured) -> None:
    replies = [wb.invoke_reply(CLAUDE.body(TOKENS, USAGE)),
               wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]
    async with bedrock(replies) as (client, _):
        with suppress_instrumentation():
            body = (await client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi"))))["body"]
            stream = (await client.converse_stream(modelId=MODEL, messages=MESSAGES))["stream"]
        assert type(response_of(body)).__name__ == "ClientResponse"  # aiohttp's, unread by us
        assert type(stream) is AioEventStream
        assert await body.read() == replies[0].body and len([event async for event in stream]) > 0
    assert otel.spans() == []


async def test_instrument_and_uninstrument_are_exact(instrument: Instrument) -> None:
    targets = [(aiobotocore.client.AioBaseClient, "_make_api_call"),
               (aiobotocore.endpoint, "convert_to_response_dict"), (aiobotocore.endpoint.AioEndpoint, "_needs_retry")]
    originals = [vars(owner)[name] for owner, name in targets]
    replies = [wb.converse_reply(wb.converse_body("Hi", usage=USAGE, latency_ms=5)) for _ in range(2)]
    async with bedrock(replies) as (client, _):
        captured = instrument()  # the client was made before
        assert all(isinstance(vars(owner)[name], wrapt.FunctionWrapper) for owner, name in targets)
        await client.converse(modelId=MODEL, messages=MESSAGES)
        otel_llm.uninstrument()
        assert [vars(owner)[name] for owner, name in targets] == originals
        await client.converse(modelId=MODEL, messages=MESSAGES)
    assert len(captured.spans()) == 1


async def test_opentelemetrys_bedrock_extension_asked_from_a_coroutine_leaves_the_call_to_us(
        instrument: Instrument) -> None:
    """Should OpenTelemetry's botocore instrumentation ask its bedrock extension about aiobotocore's calls (0.66
    does not yet), they are ours to record while our wrapper is on aiobotocore's path: the answer is no."""
    from opentelemetry.instrumentation.botocore.extensions.bedrock import _BedrockRuntimeExtension
    from opentelemetry.instrumentation.botocore.extensions.types import _AwsSdkCallContext

    async with bedrock([]) as (client, _):
        extension = _BedrockRuntimeExtension(_AwsSdkCallContext(client, ("Converse", {})))
    assert extension.should_trace_service_call() is True
    instrument()
    assert extension.should_trace_service_call() is False
    otel_llm.uninstrument()
    assert extension.should_trace_service_call() is True


def test_aiobotocore_is_patched_when_imported_and_a_boto3_service_never_imports_it() -> None:
    """Its own adapter, as each client has: a service with aiobotocore installed that uses boto3 alone does not
    import it (nor aiohttp) because of us; one that imports it after instrument() gets it patched."""
    script = """if True:
        import sys
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        import otel_llm
        otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
        import boto3
        boto3.client("bedrock-runtime", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
        print(sorted(name for name in ("aiobotocore", "aiohttp") if name in sys.modules))
        import aiobotocore.session, aiobotocore.client, wrapt
        print(isinstance(vars(aiobotocore.client.AioBaseClient)["_make_api_call"], wrapt.FunctionWrapper))
    """
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "True"]
    assert [(t.module, t.attribute) for t in aiobotocore_adapter.PROVIDER.targets] == [
        ("aiobotocore.client", "AioBaseClient._make_api_call"),
        ("aiobotocore.endpoint", "convert_to_response_dict"),
        ("aiobotocore.endpoint", "AioEndpoint._needs_retry")]


@pytest.mark.parametrize("ours_first", [True, False], ids=["ours-first", "theirs-first"])
async def test_opentelemetrys_aiobotocore_instrumentation_beside_us_traces_the_sdk_call_only(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch, ours_first: bool) -> None:
    """Its aiobotocore instrumentation has no bedrock extension: it traces each inference call as an AWS SDK call,
    and the GenAI span and metrics are ours alone, whichever of the two wrapped aiobotocore first."""
    from opentelemetry.instrumentation.botocore import AiobotocoreInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    base = aiobotocore.client.AioBaseClient
    monkeypatch.setattr(base, "_make_api_call", vars(base)["_make_api_call"])  # a wrapper left inside theirs
    theirs = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(theirs))
    captured = instrument() if ours_first else None
    AiobotocoreInstrumentor().instrument(tracer_provider=tracer_provider)
    try:
        captured = captured or instrument()
        replies = [wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]
        async with bedrock(replies) as (client, _):
            assert len(await consume(CONVERSE_STREAM, client)) == len(CONVERSE_STREAM.events(TOKENS, USAGE, None))
    finally:
        AiobotocoreInstrumentor().uninstrument()
    captured.assert_finished(None)
    assert attributes(captured.span())[sc.USAGE_OUTPUT_TOKENS] == USAGE.output
    assert [(span.name, span.attributes.get(sc.OPERATION_NAME)) for span in theirs.get_finished_spans()] == [
        ("Bedrock Runtime.ConverseStream", None)]


async def test_a_wrapper_of_ours_left_inside_theirs_leaves_each_call_to_the_round_recording_it(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ours, then theirs over it: our uninstrument() cannot take ours out from under theirs (their uninstrument()
    would put it back, bound, as it found it). Instrumented again, over theirs, the new round records each call
    once and the old wrapper passes it through untouched: the caller reads aiobotocore's stream."""
    from opentelemetry.instrumentation.botocore import AiobotocoreInstrumentor

    base = aiobotocore.client.AioBaseClient
    monkeypatch.setattr(base, "_make_api_call", vars(base)["_make_api_call"])  # ours would outlive the test
    instrument()
    AiobotocoreInstrumentor().instrument()
    try:
        otel_llm.uninstrument()
        captured = instrument()
        replies = [wb.stream_reply(call.events(TOKENS, USAGE, None)) for call in STREAM_CALLS]
        async with bedrock(replies) as (client, _):
            for call in STREAM_CALLS:
                assert len(await consume(call, client)) == len(call.events(TOKENS, USAGE, None))
    finally:
        AiobotocoreInstrumentor().uninstrument()
    assert [attributes(span)[sc.CONTENT_CHUNKS] for span in captured.spans()] == [3] * len(STREAM_CALLS)


def test_the_bedrock_benchmark_prints_every_figure() -> None:
    """benchmarks/bedrock.py, a smoke run: its figures are read by people, and each must be there."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bedrock.py"
    result = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    number = r"[+-]?\d+\.\d+"
    for client in ("boto3", "aiobotocore"):
        for workload in ("converse", "converse_stream 16 tokens", "converse_stream 256 tokens", "invoke_model"):
            assert re.search(rf"^{client}\s+{workload}\s+{number}\s+{number}\s+{number} \({number}\)$", result.stdout,
                             re.M), result.stdout
        assert re.search(rf"^{client}\s+per further streamed token: {number} us$", result.stdout, re.M), result.stdout
