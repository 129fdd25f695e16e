"""boto3's bedrock-runtime through otel_llm, at the wire: a loopback server speaks Bedrock's JSON and the AWS
event-stream framing, and real boto3 signs, sends, retries and parses. One span per call with whole metric points,
every way a stream can finish, Bedrock's own latency beside ours, and error codes as error.type."""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import copy
import gc
import importlib.util
import io
import itertools
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.client
import botocore.endpoint
import pytest
import wire
import wire_bedrock as wb
import wrapt
from botocore.eventstream import ChecksumMismatch, EventStream, EventStreamBuffer
from botocore.exceptions import ClientError, EventStreamError, ResponseStreamingError
from botocore.response import StreamingBody
from botocore.stub import Stubber
from conftest import Captured, Instrument, attributes, pickling_error
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode
from urllib3.exceptions import ProtocolError

import otel_llm
from otel_llm import _safety
from otel_llm import _semconv as sc
from otel_llm.providers import bedrock as bedrock_adapter

MODEL = "us.anthropic.claude-3-5-haiku-20241022-v1:0"  # an inference-profile id
LLAMA_ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-2-3b-instruct-v1:0"
TOKENS = ["Hel", "lo", " world"]
USAGE = wb.Tokens(input=12, output=3, cache_read=4, cache_write=2)
INPUT_TOKENS = 12 + 4 + 2  # the conventions count cached input in; Bedrock reports it apart
SYSTEM = [{"text": "Be brief."}]
MESSAGES = [{"role": "user", "content": [{"text": "Say hello"}]}]
PROMPT_CHARS = len("Be brief.") + len("Say hello")
CLAUDE = wb.FORMAT["claude-messages"]
LLAMA = wb.FORMAT["llama"]
MS = 1e-3
GUARDRAIL = "sgi5gkybzqak"
GUARDRAIL_ARN = "arn:aws:bedrock:us-east-1:123456789012:guardrail/sgi5gkybzqak"


@contextlib.contextmanager
def bedrock(replies: wire.ReplySource, *, attempts: int = 1) -> Iterator[tuple[Any, wire.LoopbackServer]]:
    """A bedrock-runtime client on a loopback server answering with ``replies``."""
    with wire.LoopbackServer(replies) as server:
        yield wb.client(server, attempts=attempts), server


def identity(server: wire.LoopbackServer, model: str = MODEL, operation: str = sc.OP_CHAT) -> dict[str, Any]:
    return {sc.OPERATION_NAME: operation, sc.PROVIDER_NAME: sc.PROVIDER_AWS_BEDROCK, sc.REQUEST_MODEL: model,
            sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: urlsplit(server.base_url).port}


def sdk_call(method: str) -> dict[str, Any]:
    """What the AWS SDK conventions put on the span of the call (as OpenTelemetry's botocore instrumentation does): the
    region is the client's, though the endpoint (a loopback one here, a private one in a VPC) does not name it."""
    return {sc.RPC_SYSTEM: "aws-api", sc.RPC_SERVICE: "Bedrock Runtime", sc.RPC_METHOD: method,
            sc.CLOUD_REGION: wb.REGION}


def payload(event: dict[str, Any]) -> dict[str, Any]:
    """The model JSON inside an invoke_model_with_response_stream event."""
    decoded: dict[str, Any] = json.loads(event["chunk"]["bytes"])
    return decoded


@dataclass(frozen=True)
class StreamCall:
    """One streaming operation: how an application calls it, where the result holds the stream, the wire events."""

    name: str
    key: str
    leading: int  # events before the first token
    exception_type: str  # the stream member a mid-stream error event names
    start: Callable[[Any], dict[str, Any]]
    events: Callable[[list[str], wb.Tokens, bytes | None], list[bytes]]

    def is_content(self, event: dict[str, Any]) -> bool:
        if self.key == "stream":
            return "contentBlockDelta" in event
        chunk = payload(event)
        return chunk.get("type") == "content_block_delta" or bool(chunk.get("generation"))


def invoke_events(fmt: wb.Format, leading: int) -> Callable[[list[str], wb.Tokens, bytes | None], list[bytes]]:
    def events(tokens: list[str], usage: wb.Tokens, error: bytes | None) -> list[bytes]:
        chunks = fmt.stream(tokens, usage)
        if error is not None:
            return [*wb.invoke_stream(chunks[:leading + len(tokens)], None), error]
        return wb.invoke_stream(chunks, wb.invocation_metrics(usage, latency_ms=80, first_byte_ms=30))

    return events


CONVERSE_STREAM = StreamCall(
    "converse_stream", "stream", 1, "modelStreamErrorException",
    lambda client: client.converse_stream(modelId=MODEL, system=SYSTEM, messages=MESSAGES),
    lambda tokens, usage, error: wb.converse_stream(tokens, usage=usage, latency_ms=90, error=error),
)
INVOKE_LLAMA_STREAM = StreamCall(
    "invoke_llama_stream", "body", 0, "throttlingException",
    lambda client: client.invoke_model_with_response_stream(modelId=LLAMA_ARN, body=json.dumps(LLAMA.request("Hi"))),
    invoke_events(LLAMA, 0),
)
INVOKE_CLAUDE_STREAM = StreamCall(
    "invoke_claude_stream", "body", 2, "modelTimeoutException",
    lambda client: client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi"))),
    invoke_events(CLAUDE, 2),
)
STREAM_CALLS = [CONVERSE_STREAM, INVOKE_LLAMA_STREAM, INVOKE_CLAUDE_STREAM]


def stream_ids(call: StreamCall) -> str:
    return call.name


# --- the wire fake itself --------------------------------------------------------------------------------------


def test_event_stream_framing_is_what_botocores_decoder_reads() -> None:
    frames = [
        wb.message({":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
                   b'{"bytes":"e30="}'),
        wb.message({":message-type": "event", "note": "héllo"}, b""),
        wb.exception("throttlingException", "slow down"),
    ]
    decoder = EventStreamBuffer()
    for byte in b"".join(frames):  # one byte at a time: messages are found across any network split
        decoder.add_data(bytes([byte]))
    decoded = list(decoder)
    assert [m.headers for m in decoded] == [
        {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
        {":message-type": "event", "note": "héllo"},
        {":exception-type": "throttlingException", ":content-type": "application/json", ":message-type": "exception"},
    ]
    assert [m.payload for m in decoded] == [b'{"bytes":"e30="}', b"", b'{"message":"slow down"}']
    assert [m.prelude.total_length for m in decoded] == [len(f) for f in frames]
    # both CRCs are checked: one flipped bit in the prelude, the headers, the payload or a CRC is caught
    for position in (2, 13, len(frames[0]) - 6, len(frames[0]) - 1):
        broken = bytearray(frames[0])
        broken[position] ^= 1
        decoder = EventStreamBuffer()
        decoder.add_data(bytes(broken))
        with pytest.raises(ChecksumMismatch):
            list(decoder)


# --- whole spans and metric points -------------------------------------------------------------------------------


def test_converse_is_one_span_with_usage_and_bedrocks_own_latency(otel: Captured) -> None:
    body = wb.converse_body("Hello world", usage=USAGE, latency_ms=412)
    with bedrock([wb.converse_reply(body)]) as (client, server):
        result = client.converse(
            modelId=MODEL, system=SYSTEM, messages=MESSAGES,
            inferenceConfig={"maxTokens": 50, "temperature": 0.2, "topP": 0.9, "stopSequences": ["\n\n"]},
            additionalModelRequestFields={"top_k": 40}, guardrailConfig={"guardrailIdentifier": GUARDRAIL,
                                                                         "guardrailVersion": "1"})
    assert result["output"]["message"]["content"] == [{"text": "Hello world"}]
    request = server.requests[0]
    assert request.path == "/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse"
    assert request.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=test/")  # really signed

    span = otel.span()
    assert (span.name, span.kind, span.status.status_code) == (f"chat {MODEL}", SpanKind.CLIENT, StatusCode.UNSET)
    attrs = dict(attributes(span))
    headers_time = attrs.pop(sc.TIME_TO_HEADERS)
    assert attrs == {
        **identity(server),
        sc.REQUEST_STREAM: False,
        sc.PROMPT_LENGTH: PROMPT_CHARS,
        sc.REQUEST_MAX_TOKENS: 50,
        sc.REQUEST_TEMPERATURE: 0.2,
        sc.REQUEST_TOP_P: 0.9,
        sc.REQUEST_TOP_K: 40,
        sc.REQUEST_STOP_SEQUENCES: ("\n\n",),
        sc.RESPONSE_FINISH_REASONS: ("end_turn",),
        sc.USAGE_INPUT_TOKENS: INPUT_TOKENS,
        sc.USAGE_OUTPUT_TOKENS: 3,
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 4,
        sc.USAGE_CACHE_CREATION_INPUT_TOKENS: 2,
        sc.PROVIDER_LATENCY: 0.412,  # Bedrock's metrics.latencyMs, beside our own duration
        sc.AWS_BEDROCK_GUARDRAIL_ID: GUARDRAIL,
        **sdk_call("Converse"),
        sc.AWS_REQUEST_ID: wb.REQUEST_ID,  # the response's x-amzn-RequestId: what AWS support asks for
    }
    assert type(attrs[sc.REQUEST_TOP_K]) is float  # a double in the conventions, though sent as 40
    assert span.end_time is not None and span.start_time is not None
    assert 0 < headers_time <= (span.end_time - span.start_time) / 1e9

    duration = otel.point(sc.STABLE_NAMES.duration.name)
    assert dict(duration.attributes) == {**identity(server), sc.REQUEST_STREAM: False, sc.PROMPT_SIZE: "<1k"}
    assert duration.count == 1
    assert otel.points(sc.STABLE_NAMES.time_to_first_chunk.name) == []
    usage_name = sc.STABLE_NAMES.token_usage.name  # type: ignore[union-attr]
    assert otel.point(usage_name, gen_ai__token__type="input").sum == INPUT_TOKENS
    assert otel.point(usage_name, gen_ai__token__type="output").sum == 3
    prompt = otel.point(sc.STABLE_NAMES.prompt_length.name)
    assert (prompt.count, prompt.sum) == (1, PROMPT_CHARS)


def test_prompt_length_counts_earlier_tool_calls_input_and_json_results_as_the_json_sent(otel: Captured) -> None:
    """A tool loop sends the model's toolUse back, and the tool's result, as text or as JSON: the JSON counted as
    it goes out (compact, unescaped); the tool's name and ids are not text of the conversation."""
    tool_use = {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather", "input": {"city": "Zürich", "days": 2}}}
    messages = [
        {"role": "user", "content": [{"text": "Weather?"}]},
        {"role": "assistant", "content": [{"text": "Checking."}, tool_use]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "tooluse_1", "status": "success", "content": [
            {"text": "18 C"}, {"json": {"wind": "calm"}}]}}]},
    ]
    with bedrock([wb.converse_reply(wb.converse_body("Mild", usage=USAGE, latency_ms=5))]) as (client, server):
        client.converse(modelId=MODEL, messages=messages)
    sent = json.loads(server.requests[0].body)["messages"]
    assert json.dumps(sent[1]["content"][1]["toolUse"]["input"], ensure_ascii=False, separators=(",", ":")) == (
        '{"city":"Zürich","days":2}')
    expected = len("Weather?Checking.") + len('{"city":"Zürich","days":2}') + len("18 C") + len('{"wind":"calm"}')
    assert attributes(otel.span())[sc.PROMPT_LENGTH] == expected


def test_converse_stream_is_one_span_with_ttft_usage_and_bedrocks_own_latency(otel: Captured) -> None:
    # pauses: 20 ms to the headers, messageStart (not a token) after 10 ms, the first token 30 ms later, then 10 ms
    reply = wb.stream_reply(wb.converse_stream(TOKENS, usage=USAGE, latency_ms=90), headers_delay=0.02,
                            delays=[0.01, 0.03, 0.01, 0.01])
    with bedrock([reply]) as (client, server):
        response = client.converse_stream(modelId=MODEL, system=SYSTEM, messages=MESSAGES,
                                          inferenceConfig={"maxTokens": 50})
        assert isinstance(response["stream"], EventStream)
        assert set(response) == {"ResponseMetadata", "stream"}
        received = list(response["stream"])
    assert [next(iter(event)) for event in received] == [
        "messageStart", "contentBlockDelta", "contentBlockDelta", "contentBlockDelta", "contentBlockStop",
        "messageStop", "metadata"]

    span = otel.span()
    assert span.status.status_code is StatusCode.UNSET
    attrs = dict(attributes(span))
    timings = {key: attrs.pop(key) for key in (sc.RESPONSE_TIME_TO_FIRST_CHUNK, sc.MAX_CHUNK_GAP,
                                                 sc.TIME_PER_OUTPUT_TOKEN, sc.TIME_TO_HEADERS)}
    assert attrs == {
        **identity(server),
        sc.REQUEST_STREAM: True,
        sc.PROMPT_LENGTH: PROMPT_CHARS,
        sc.REQUEST_MAX_TOKENS: 50,
        sc.RESPONSE_FINISH_REASONS: ("end_turn",),
        sc.USAGE_INPUT_TOKENS: INPUT_TOKENS,
        sc.USAGE_OUTPUT_TOKENS: 3,
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 4,
        sc.USAGE_CACHE_CREATION_INPUT_TOKENS: 2,
        sc.CONTENT_CHUNKS: 3,
        sc.PROVIDER_LATENCY: 0.09,  # from the metadata event
        **sdk_call("ConverseStream"),
        sc.AWS_REQUEST_ID: wb.REQUEST_ID,
    }
    # first content comes after the headers, messageStart and the first token's pause: messageStart is not a token.
    # (How closely these agree with the caller's own clock is test_ttft_gaps_and_duration_match_...'s subject.)
    ttft, tpot = timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK], timings[sc.TIME_PER_OUTPUT_TOKEN]
    assert ttft >= 0.06
    assert 0.02 <= timings[sc.TIME_TO_HEADERS] < ttft
    assert 0 < timings[sc.MAX_CHUNK_GAP] <= 2 * tpot + 1e-9  # the longer of two gaps, spread over two tokens

    metric_attrs = identity(server)
    timing_attrs = {**metric_attrs, sc.REQUEST_STREAM: True, sc.PROMPT_SIZE: "<1k"}
    duration = otel.point(sc.STABLE_NAMES.duration.name)
    assert dict(duration.attributes) == timing_attrs
    assert duration.count == 1 and duration.sum >= max(0.08, ttft + 2 * tpot) - 1e-9
    ttfc = otel.point(sc.STABLE_NAMES.time_to_first_chunk.name)
    assert dict(ttfc.attributes) == timing_attrs
    assert ttfc.count == 1 and ttfc.sum == pytest.approx(ttft, abs=1e-9)
    gaps = otel.point(sc.STABLE_NAMES.time_per_output_chunk.name)
    assert dict(gaps.attributes) == metric_attrs
    assert gaps.count == 2 and gaps.sum == pytest.approx(2 * tpot, abs=1e-6)
    tpot_point = otel.point(sc.STABLE_NAMES.time_per_output_token.name)
    assert tpot_point.count == 1 and tpot_point.sum == pytest.approx(tpot, abs=1e-9)
    usage_name = sc.STABLE_NAMES.token_usage.name  # type: ignore[union-attr]
    assert otel.point(usage_name, gen_ai__token__type="output").sum == 3


def test_invoke_model_reads_the_body_and_bedrocks_headers(otel: Captured) -> None:
    body = CLAUDE.body(TOKENS, USAGE)
    with bedrock([wb.invoke_reply(body, wb.invocation_headers(USAGE, latency_ms=377))]) as (client, server):
        response = client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Say hello")),
                                       guardrailIdentifier=GUARDRAIL_ARN, guardrailVersion="DRAFT")
        # the caller reads the body exactly as sent, from the StreamingBody it always got
        assert isinstance(response["body"], StreamingBody)
        assert response["body"].read() == wb.invoke_reply(body).body
    assert response["contentType"] == "application/json"

    attrs = dict(attributes(otel.span()))
    assert attrs.pop(sc.TIME_TO_HEADERS) > 0
    assert attrs == {
        **identity(server),
        sc.REQUEST_STREAM: False,
        sc.PROMPT_LENGTH: PROMPT_CHARS,
        sc.REQUEST_MAX_TOKENS: 256,
        sc.REQUEST_TEMPERATURE: 0.5,
        sc.REQUEST_TOP_K: 40,
        sc.RESPONSE_ID: wb.CLAUDE_ID,
        sc.RESPONSE_MODEL: wb.CLAUDE_MODEL,
        sc.RESPONSE_FINISH_REASONS: ("end_turn",),
        sc.USAGE_INPUT_TOKENS: INPUT_TOKENS,
        sc.USAGE_OUTPUT_TOKENS: 3,
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 4,
        sc.USAGE_CACHE_CREATION_INPUT_TOKENS: 2,
        sc.PROVIDER_LATENCY: 0.377,  # x-amzn-bedrock-invocation-latency
        sc.AWS_BEDROCK_GUARDRAIL_ID: GUARDRAIL_ARN,  # as the caller named it
        **sdk_call("InvokeModel"),
        sc.AWS_REQUEST_ID: wb.REQUEST_ID,
    }


def test_invoke_model_stream_with_an_arn_model_id(otel: Captured) -> None:
    usage = wb.Tokens(input=9, output=4)
    events = INVOKE_LLAMA_STREAM.events(TOKENS, usage, None)
    with bedrock([wb.stream_reply(events, headers={"X-Amzn-Bedrock-Content-Type": "application/json"})]) as (
            client, server):
        response = INVOKE_LLAMA_STREAM.start(client)
        assert response["contentType"] == "application/json"
        chunks = [payload(event) for event in response["body"]]
    assert [c["generation"] for c in chunks] == [*TOKENS, ""]
    assert server.requests[0].path == "/model/" + LLAMA_ARN.replace(":", "%3A").replace("/", "%2F") + \
        "/invoke-with-response-stream"

    attrs = dict(attributes(otel.span()))
    for key in (sc.RESPONSE_TIME_TO_FIRST_CHUNK, sc.MAX_CHUNK_GAP, sc.TIME_PER_OUTPUT_TOKEN, sc.TIME_TO_HEADERS):
        assert attrs.pop(key) > 0
    assert attrs == {
        **identity(server, LLAMA_ARN, sc.OP_TEXT_COMPLETION),
        sc.REQUEST_STREAM: True,
        sc.PROMPT_LENGTH: len(LLAMA.request("Hi")["prompt"]),
        sc.REQUEST_MAX_TOKENS: 128,
        sc.REQUEST_TEMPERATURE: 0.5,
        sc.REQUEST_TOP_P: 0.9,
        sc.RESPONSE_FINISH_REASONS: ("stop",),
        sc.USAGE_INPUT_TOKENS: 9,
        sc.USAGE_OUTPUT_TOKENS: 4,
        # Llama's chunks say nothing of caching; Bedrock's invocation metrics do
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 0,
        sc.USAGE_CACHE_CREATION_INPUT_TOKENS: 0,
        sc.CONTENT_CHUNKS: 3,
        # amazon-bedrock-invocationMetrics of the last chunk
        sc.PROVIDER_LATENCY: 0.08,
        sc.PROVIDER_TIME_TO_FIRST_BYTE: 0.03,
        **sdk_call("InvokeModelWithResponseStream"),
        sc.AWS_REQUEST_ID: wb.REQUEST_ID,
    }


# --- timing agrees with what the caller observed -----------------------------------------------------------------

TIMING_TOKENS = ["one", " two", " three", " four", " five"]
TIMING_USAGE = wb.Tokens(input=20, output=5)
HEADERS_DELAY = 0.08
# the events before the first token come after 40 ms; the first token 30 ms later; gaps well inside their buckets;
# the rest 20 ms after the last token (a duration that ended at the last token would be 20 ms short)
LEAD_DELAY, FIRST_DELAY, GAPS, TAIL_DELAY = 0.04, 0.03, [0.0225, 0.045, 0.072, 0.0285], 0.02

Observation = tuple[int, list[tuple[int, bool]], int]  # issued, (arrival, is content) per event, ended


def observe(call: StreamCall, client: Any) -> Observation:
    issued = time.perf_counter_ns()
    response = call.start(client)
    arrivals = [(time.perf_counter_ns(), call.is_content(event)) for event in response[call.key]]
    return issued, arrivals, time.perf_counter_ns()


def content_gaps(arrivals: list[tuple[int, bool]]) -> list[float]:
    content = [t for t, is_content in arrivals if is_content]
    return [(b - a) / 1e9 for a, b in itertools.pairwise(content)]


@pytest.mark.usefixtures("steady_clock")
@pytest.mark.parametrize("call", [CONVERSE_STREAM, INVOKE_CLAUDE_STREAM], ids=stream_ids)
def test_ttft_gaps_and_duration_match_the_callers_observation(otel: Captured, call: StreamCall) -> None:
    events = call.events(TIMING_TOKENS, TIMING_USAGE, None)
    delays = [*([0.0] * call.leading), FIRST_DELAY, *GAPS, TAIL_DELAY]
    delays[0] = LEAD_DELAY
    reply = wb.stream_reply(events, headers_delay=HEADERS_DELAY, delays=delays)
    with bedrock(lambda request: reply) as (client, _):
        # the first call warms the connection, botocore's lazy loading and the SDK's aggregations
        warm_up, (issued, arrivals, ended) = observe(call, client), observe(call, client)

    content = [t for t, is_content in arrivals if is_content]
    assert len(content) == len(TIMING_TOKENS)
    observed_ttft = (content[0] - issued) / 1e9
    observed_gaps = content_gaps(arrivals)
    observed_duration = (ended - issued) / 1e9

    first, second = otel.spans()
    attrs = attributes(second)
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] == pytest.approx(observed_ttft, abs=1 * MS)
    assert attrs[sc.MAX_CHUNK_GAP] == pytest.approx(max(observed_gaps), abs=1 * MS)
    assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(sum(observed_gaps) / (len(TIMING_TOKENS) - 1), abs=1 * MS)
    # the events before the first token did not count
    assert observed_ttft >= HEADERS_DELAY + LEAD_DELAY + FIRST_DELAY
    assert second.end_time is not None and second.start_time is not None
    # the duration is TTFT and the tail after the first token, each within 1 ms of the caller's view of it
    recorded_duration = (second.end_time - second.start_time) / 1e9
    recorded_tail = recorded_duration - attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK]
    assert recorded_tail == pytest.approx((ended - content[0]) / 1e9, abs=1 * MS)
    assert recorded_duration <= observed_duration

    ttfc = otel.point(sc.STABLE_NAMES.time_to_first_chunk.name)
    first_ttft = attributes(first)[sc.RESPONSE_TIME_TO_FIRST_CHUNK]
    assert ttfc.count == 2 and ttfc.sum - first_ttft == pytest.approx(observed_ttft, abs=1 * MS)
    gaps = otel.point(sc.STABLE_NAMES.time_per_output_chunk.name)
    all_gaps = content_gaps(warm_up[1]) + observed_gaps
    assert gaps.count == len(all_gaps)
    assert gaps.sum == pytest.approx(sum(all_gaps), abs=1 * MS)
    expected_buckets = [0] * (len(sc.CHUNK_BUCKETS) + 1)
    for gap in all_gaps:
        expected_buckets[bisect.bisect_left(sc.CHUNK_BUCKETS, gap)] += 1
    assert list(gaps.bucket_counts) == expected_buckets


def test_duration_is_measured_from_the_call_not_from_client_creation(otel: Captured) -> None:
    body = wb.converse_body("Hi", usage=USAGE, latency_ms=5)
    with bedrock([wb.converse_reply(body)]) as (client, _):
        time.sleep(0.2)
        client.converse(modelId=MODEL, messages=MESSAGES)
    span = otel.span()
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 < 0.2


# --- every body format -------------------------------------------------------------------------------------------

FORMAT_OPERATIONS = {
    "claude-messages": sc.OP_CHAT, "claude-text": sc.OP_TEXT_COMPLETION, "llama": sc.OP_TEXT_COMPLETION,
    "titan": sc.OP_TEXT_COMPLETION, "nova": sc.OP_CHAT, "cohere-generate": sc.OP_TEXT_COMPLETION,
    "cohere-chat": sc.OP_CHAT, "mistral": sc.OP_TEXT_COMPLETION, "mistral-chat": sc.OP_CHAT,
}
FORMAT_USAGE = wb.Tokens(input=9, output=4)
CAPTURE = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"}


def format_ids(fmt: wb.Format) -> str:
    return fmt.name


def output_text(attrs: Any) -> str:
    text: str = json.loads(attrs[sc.OUTPUT_MESSAGES])[0]["parts"][0]["content"]
    return text


@pytest.mark.parametrize("with_headers", [True, False], ids=["with-headers", "body-only"])
@pytest.mark.parametrize("fmt", wb.FORMATS, ids=format_ids)
def test_invoke_model_reads_every_body_format(instrument: Instrument, fmt: wb.Format, with_headers: bool) -> None:
    captured = instrument(**CAPTURE)
    headers = wb.invocation_headers(FORMAT_USAGE, latency_ms=250) if with_headers else None
    with bedrock([wb.invoke_reply(fmt.body(TOKENS, FORMAT_USAGE), headers)]) as (client, _):
        response = client.invoke_model(modelId=fmt.model_id, body=json.dumps(fmt.request("Say hello")))
        assert json.loads(response["body"].read()) == fmt.body(TOKENS, FORMAT_USAGE)

    attrs = attributes(captured.span())
    assert attrs[sc.OPERATION_NAME] == FORMAT_OPERATIONS[fmt.name]
    assert attrs[sc.REQUEST_TEMPERATURE] == 0.5
    assert attrs[sc.REQUEST_MAX_TOKENS] in (100, 128, 200, 256)
    assert "Say hello" in attrs[sc.INPUT_MESSAGES]
    assert attrs[sc.PROMPT_LENGTH] >= len("Say hello")
    assert attrs[sc.RESPONSE_FINISH_REASONS] == (fmt.stop_reason,)
    assert output_text(attrs) == "".join(TOKENS)
    known = with_headers or fmt.usage_in_body  # unknown stays unset
    assert (attrs.get(sc.USAGE_INPUT_TOKENS), attrs.get(sc.USAGE_OUTPUT_TOKENS)) == ((9, 4) if known else (None, None))
    assert attrs.get(sc.PROVIDER_LATENCY) == (0.25 if with_headers else None)


@pytest.mark.parametrize("with_metrics", [True, False], ids=["with-metrics", "chunks-only"])
@pytest.mark.parametrize("fmt", wb.FORMATS, ids=format_ids)
def test_invoke_model_stream_reads_every_chunk_format(instrument: Instrument, fmt: wb.Format,
                                                      with_metrics: bool) -> None:
    captured = instrument(**CAPTURE)
    chunks = fmt.stream(TOKENS, FORMAT_USAGE)
    metrics = wb.invocation_metrics(FORMAT_USAGE, latency_ms=480, first_byte_ms=120) if with_metrics else None
    with bedrock([wb.stream_reply(wb.invoke_stream(chunks, metrics))]) as (client, _):
        response = client.invoke_model_with_response_stream(modelId=fmt.model_id,
                                                            body=json.dumps(fmt.request("Say hello")))
        received = [payload(event) for event in response["body"]]
    assert received == wb.with_invocation_metrics(chunks, metrics)

    attrs = attributes(captured.span())
    assert attrs[sc.OPERATION_NAME] == FORMAT_OPERATIONS[fmt.name]
    assert attrs[sc.CONTENT_CHUNKS] == len(TOKENS)
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] > 0
    assert attrs[sc.RESPONSE_FINISH_REASONS] == (fmt.stop_reason,)
    assert output_text(attrs) == "".join(TOKENS)
    known = with_metrics or fmt.usage_in_body
    assert (attrs.get(sc.USAGE_INPUT_TOKENS), attrs.get(sc.USAGE_OUTPUT_TOKENS)) == ((9, 4) if known else (None, None))
    assert attrs.get(sc.PROVIDER_LATENCY) == (0.48 if with_metrics else None)
    assert attrs.get(sc.PROVIDER_TIME_TO_FIRST_BYTE) == (0.12 if with_metrics else None)


@pytest.mark.parametrize("name", ["nova", "claude-messages", "llama"])
def test_invoke_stream_input_counts_the_cache_bedrocks_metrics_give(otel: Captured, name: str) -> None:
    """The model's JSON gives the input without the cache; Bedrock's metrics in the last chunk give the cache
    counts: the input counts them in, whichever came first."""
    fmt, usage = wb.FORMAT[name], wb.Tokens(input=12, output=3, cache_read=1000, cache_write=200)
    chunks = fmt.stream(TOKENS, usage)
    if name == "claude-messages":  # a message_start that names no cache (a model or region without caching)
        del chunks[0]["message"]["usage"]["cache_read_input_tokens"]
        del chunks[0]["message"]["usage"]["cache_creation_input_tokens"]
    metrics = wb.invocation_metrics(usage, latency_ms=100, first_byte_ms=20)
    with bedrock([wb.stream_reply(wb.invoke_stream(chunks, metrics))]) as (client, _):
        list(client.invoke_model_with_response_stream(modelId=fmt.model_id, body=json.dumps(fmt.request("hi")))[
            "body"])
    attrs = attributes(otel.span())
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_CACHE_READ_INPUT_TOKENS],
            attrs[sc.USAGE_CACHE_CREATION_INPUT_TOKENS]) == (1212, 1000, 200)
    (point,) = [p for p in otel.points(sc.STABLE_NAMES.token_usage.name) if p.attributes[sc.TOKEN_TYPE] == "input"]
    assert point.sum == 1212


def _claude_events(blocks: list[list[dict[str, Any]]], output_tokens: int,
                   thinking_tokens: int | None = None) -> list[dict[str, Any]]:
    """Claude's messages stream as Bedrock frames it: each block its start, deltas and stop."""
    usage: dict[str, Any] = {"output_tokens": output_tokens}
    if thinking_tokens is not None:
        usage["output_tokens_details"] = {"thinking_tokens": thinking_tokens}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        "id": "msg_bdrk_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 30, "output_tokens": 1}}}]
    for index, (start, *deltas) in enumerate(blocks):
        events += [{"type": "content_block_start", "index": index, "content_block": start},
                   *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
                   {"type": "content_block_stop", "index": index}]
    return [*events, {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                      "usage": usage}, {"type": "message_stop"}]


def _text_block(tokens: list[str]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": ""}, *({"type": "text_delta", "text": token} for token in tokens)]


@pytest.mark.parametrize(("thinking", "counted"), [("omitted", True), ("omitted", False), ("redacted", False),
                                                   ("streamed", True)],
                         ids=["thinking omitted", "thinking omitted, not counted", "thinking redacted, not counted",
                              "thinking streamed"])
@pytest.mark.timing  # TPOT from pauses of 10-20 ms, within 4 ms
def test_invoke_stream_tpot_counts_the_thinking_tokens_that_streamed(otel: Captured, thinking: str,
                                                                     counted: bool) -> None:
    """Claude's thinking omitted (its block carries only a signature): the 2000 thinking tokens in the output count
    never streamed, and the answer's 5 tokens, 20 ms apart, are what TPOT times. Without that count (or with a
    redacted block) the answer's own is unknown: no TPOT. Streamed, the thinking tokens count."""
    shown = thinking == "streamed"
    block = ([{"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}] if thinking == "redacted" else
             [{"type": "thinking", "thinking": "", "signature": ""},
              *([{"type": "thinking_delta", "thinking": "Hmm."}] if shown else []),
              {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}])
    events = _claude_events([block, _text_block(list("abcde"))], output_tokens=7 if shown else 2005,
                            thinking_tokens=(2 if shown else 2000) if counted else None)
    first_text = next(i for i, e in enumerate(events) if e.get("delta", {}).get("type") == "text_delta")
    delays = [0.0] * first_text + [0.05] + [0.02] * 4
    with bedrock([wb.stream_reply(wb.invoke_stream(events, None), delays=delays)]) as (client, _):
        list(client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(CLAUDE.request("hi")))["body"])
    attrs = attributes(otel.span())
    assert attrs.get(sc.USAGE_REASONING_OUTPUT_TOKENS) == ((2 if shown else 2000) if counted else None)
    assert attrs[sc.CONTENT_CHUNKS] == 5 + shown
    if not counted:
        assert sc.TIME_PER_OUTPUT_TOKEN not in attrs
        assert otel.points(sc.STABLE_NAMES.time_per_output_token.name) == []
        return
    # streamed: 7 tokens over the thinking chunk, the 50 ms to the answer and its 4 gaps of 20 ms
    expected = (0.05 + 0.08) / 6 if shown else 0.02
    assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(expected, abs=0.004)


@pytest.mark.parametrize("thinking", ["omitted", "redacted", "streamed"])
@pytest.mark.timing  # TPOT from pauses of 10-20 ms, within 4 ms
def test_converse_stream_tpot_needs_the_thinking_it_counts_to_have_streamed(otel: Captured, thinking: str) -> None:
    """converse counts the thinking in its output tokens without saying how many. Thinking the stream did not show
    as text (its signature alone, or a redacted block) leaves the answer's own count unknown: no TPOT, rather than
    the answer's spread over 2005 tokens. Streamed, its tokens are among those timed."""
    parts = {"omitted": [{"signature": "EqQBCgIYAhIM"}],
             "redacted": [{"redactedContent": base64.b64encode(b"sealed").decode()}],
             "streamed": [{"text": "Hmm."}, {"signature": "EqQBCgIYAhIM"}]}[thinking]
    output = 7 if thinking == "streamed" else 2005
    events = [wb.event("messageStart", {"role": "assistant"}),
              *(wb.event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": part}})
                for part in parts),
              wb.event("contentBlockStop", {"contentBlockIndex": 0}),
              *(wb.event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": token}}) for token in "abcde"),
              wb.event("contentBlockStop", {"contentBlockIndex": 1}),
              wb.event("messageStop", {"stopReason": "end_turn"}),
              wb.event("metadata", {"usage": {"inputTokens": 9, "outputTokens": output, "totalTokens": 9 + output},
                                    "metrics": {"latencyMs": 90}})]
    delays = [0.0] * (len(parts) + 2) + [0.05] + [0.02] * 4  # the answer 50 ms after the thinking, 20 ms apart
    with bedrock([wb.stream_reply(events, delays=delays)]) as (client, _):
        list(client.converse_stream(modelId=MODEL, messages=MESSAGES)["stream"])
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == output
    assert attrs[sc.CONTENT_CHUNKS] == 5 + (thinking == "streamed")  # neither a signature nor a redacted block
    tpot = otel.points(sc.STABLE_NAMES.time_per_output_token.name)
    if thinking == "streamed":  # 7 tokens over the thinking chunk, the 50 ms to the answer and its 4 gaps of 20 ms
        assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx((0.05 + 0.08) / 6, abs=0.004)
        assert len(tpot) == 1
    else:
        assert sc.TIME_PER_OUTPUT_TOKEN not in attrs and tpot == []


@pytest.mark.timing  # TPOT from pauses of 10-20 ms, within 4 ms
def test_invoke_stream_tpot_leaves_out_a_server_tools_wait(otel: Captured) -> None:
    """Claude's web search runs on the service: 300 ms with no decoding between the text before and after."""
    search = [{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
              {"type": "input_json_delta", "partial_json": '{"query":"q"}'}]
    result = [{"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}]
    events = _claude_events([_text_block(list("abc")), search, result, _text_block(list("def"))], output_tokens=7)
    deltas = [i for i, e in enumerate(events) if e["type"] == "content_block_delta"]
    delays = [0.0] * len(events)
    for i in deltas[1:]:
        delays[i] = 0.02
    delays[deltas[4]] = 0.3  # after the search result: the first text after it
    with bedrock([wb.stream_reply(wb.invoke_stream(events, None), delays=delays)]) as (client, _):
        list(client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(CLAUDE.request("hi")))["body"])
    attrs = attributes(otel.span())
    assert attrs[sc.MAX_CHUNK_GAP] >= 0.3  # the wait is seen where it happened
    assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(0.02 * 5 / 6, abs=0.004)


@pytest.mark.parametrize("payloads, chunks", [
    ([{"choices": [{"index": 0, "message": {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "function": {"name": "get_weather", "arguments": "{}"}}]}, "stop_reason": "tool_calls"}]}], 1),
    ([{"is_finished": False, "event_type": "stream-start", "generation_id": "g1"},
      {"is_finished": False, "event_type": "tool-calls-chunk", "tool_call_delta": {"index": 0, "name": "get_weather"}},
      {"is_finished": False, "event_type": "tool-calls-chunk", "tool_call_delta": {"index": 0, "parameters": "{}"}},
      {"is_finished": False, "event_type": "tool-calls-generation",
       "tool_calls": [{"name": "get_weather", "parameters": {}}]},
      {"is_finished": True, "event_type": "stream-end", "finish_reason": "COMPLETE"}], 2),
    ([{"is_finished": False, "event_type": "stream-start", "generation_id": "g1"},
      {"is_finished": False, "event_type": "tool-calls-generation",
       "tool_calls": [{"name": "get_weather", "parameters": {}}]},
      {"is_finished": True, "event_type": "stream-end", "finish_reason": "COMPLETE"}], 1),
], ids=["mistral chat", "cohere chat", "cohere chat, calls written whole"])
def test_invoke_stream_of_tool_calls_has_a_first_token(otel: Captured, payloads: list[dict[str, Any]],
                                                       chunks: int) -> None:
    """An answer that is only a tool call: the call written is the output, and its first chunk the first token."""
    delays = [0.0] * len(payloads)
    delays[1 if len(payloads) > 1 else 0] = 0.05
    with bedrock([wb.stream_reply(wb.invoke_stream(payloads, None), delays=delays)]) as (client, _):
        list(client.invoke_model_with_response_stream(modelId="mistral.mistral-large-2407-v1:0",
                                                      body=json.dumps({"messages": []}))["body"])
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == chunks
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] >= 0.05


def test_invoke_model_of_an_embedding_model_is_an_embeddings_operation(otel: Captured) -> None:
    usage = wb.Tokens(input=6, output=0)
    reply = wb.invoke_reply({"embedding": [0.1, -0.2], "inputTextTokenCount": 6},
                            wb.invocation_headers(usage, latency_ms=40))
    with bedrock([reply]) as (client, _):
        client.invoke_model(modelId="amazon.titan-embed-text-v2:0", body=json.dumps({"inputText": "hello there"}))
    span = otel.span()
    attrs = attributes(span)
    assert span.name == "embeddings amazon.titan-embed-text-v2:0"
    assert (attrs[sc.OPERATION_NAME], attrs[sc.PROMPT_LENGTH]) == (sc.OP_EMBEDDINGS, len("hello there"))
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.PROVIDER_LATENCY]) == (6, 0.04)


def test_an_embedding_model_an_arn_names_is_an_embeddings_operation_by_its_request(otel: Captured) -> None:
    """An application inference profile's ARN does not name its model: Titan Embeddings' own request fields do."""
    arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3"
    reply = wb.invoke_reply({"embedding": [0.1, -0.2], "inputTextTokenCount": 3})
    with bedrock([reply]) as (client, _):
        client.invoke_model(modelId=arn, body=json.dumps({"inputText": "hi", "dimensions": 256, "normalize": True,
                                                          "embeddingTypes": ["float", "binary"]}))
    attrs = attributes(otel.span())
    assert attrs[sc.OPERATION_NAME] == sc.OP_EMBEDDINGS
    # the conventions' embeddings attributes (Titan's embeddingTypes and Cohere's embedding_types: encodings)
    assert (attrs[sc.EMBEDDINGS_DIMENSION_COUNT], attrs[sc.REQUEST_ENCODING_FORMATS]) == (256, ("float", "binary"))


@pytest.mark.parametrize("results", [
    [{"index": 0, "relevance_score": 0.98}, {"index": 1, "relevance_score": 0.02}],  # Cohere Rerank
    [{"index": 0, "relevanceScore": 0.98}],  # Amazon Rerank
], ids=["cohere", "amazon"])
def test_a_rerank_models_results_carry_no_output_count(otel: Captured, results: list[dict[str, Any]]) -> None:
    """Its body has results, as Titan's text has, but no token counts: none is recorded, rather than a 0."""
    with bedrock([wb.invoke_reply({"results": results})]) as (client, _):
        client.invoke_model(modelId="cohere.rerank-v3-5:0",
                            body=json.dumps({"query": "capital of France?", "documents": ["Paris", "Berlin"]}))
    assert sc.USAGE_OUTPUT_TOKENS not in attributes(otel.span())
    assert otel.points(sc.STABLE_NAMES.token_usage.name, gen_ai__token__type="output") == []


# --- every way a stream finishes, exactly once ---------------------------------------------------------------------




def assert_read_to_its_end(otel: Captured) -> None:
    """The whole response was read: finished without error, with every token and the output count."""
    otel.assert_finished(None)
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == len(TOKENS) and attrs[sc.USAGE_OUTPUT_TOKENS] == USAGE.output


def assert_cancelled_after_the_first_token(otel: Captured) -> None:
    otel.assert_finished(sc.ERROR_CANCELLED)
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 1
    # what was measured before the close is kept
    assert otel.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


def assert_ended_by_the_exception_event(otel: Captured, call: StreamCall, received: list[Any],
                                        error: EventStreamError) -> None:
    """The caller got the events before the exception event, then botocore's error; the span has its code."""
    assert len(received) == call.leading + 2
    assert error.response["Error"] == {"Code": call.exception_type, "Message": "The model stopped answering."}
    otel.assert_finished(call.exception_type[0].upper() + call.exception_type[1:])  # -> ThrottlingException
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 2


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
def test_exhausted_stream_finishes_without_error(otel: Captured, call: StreamCall) -> None:
    with bedrock([wb.stream_reply(call.events(TOKENS, USAGE, None))]) as (client, _):
        response = call.start(client)
        events = list(response[call.key])
        response[call.key].close()  # closing after the end changes nothing
    assert len(events) == len(call.events(TOKENS, USAGE, None))
    assert_read_to_its_end(otel)


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
def test_break_then_close_is_cancelled(otel: Captured, call: StreamCall) -> None:
    reply = wb.stream_reply(call.events(TOKENS, USAGE, None), delays=[0.0] * (call.leading + 1) + [0.01, 0.01])
    with bedrock([reply]) as (client, _):
        response = call.start(client)
        stream = response[call.key]
        for event in stream:
            if call.is_content(event):
                break
        assert otel.spans() == []  # still open: the caller may come back to it
        stream.close()
    assert_cancelled_after_the_first_token(otel)


def test_claudes_placeholder_output_count_is_not_a_count(otel: Captured) -> None:
    """message_start says output_tokens 1 before any output: a stream stopped early has no output count."""
    call = INVOKE_CLAUDE_STREAM
    with bedrock([wb.stream_reply(call.events(TOKENS, USAGE, None))]) as (client, _):
        stream = call.start(client)[call.key]
        for event in stream:
            if call.is_content(event):
                break
        stream.close()
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_INPUT_TOKENS] == INPUT_TOKENS
    assert sc.USAGE_OUTPUT_TOKENS not in attrs
    assert otel.points(sc.STABLE_NAMES.token_usage.name, gen_ai__token__type="output") == []


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
def test_a_caller_that_stops_at_the_last_event_has_not_cancelled(otel: Captured, call: StreamCall) -> None:
    """The last event (converse's metadata, invoke's chunk with Bedrock's invocation metrics) completes the
    response: closing the stream there, without reading on to its end, is no cancellation."""
    events = call.events(TOKENS, USAGE, None)
    with bedrock([wb.stream_reply(events)]) as (client, _):
        stream = call.start(client)[call.key]
        read = [event for _, event in zip(range(len(events)), stream, strict=False)]
        stream.close()
    assert len(read) == len(events)
    assert_read_to_its_end(otel)


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
def test_exception_event_mid_stream_passes_through_under_its_code(otel: Captured, call: StreamCall) -> None:
    error = wb.exception(call.exception_type, "The model stopped answering.")
    with bedrock([wb.stream_reply(call.events(TOKENS[:2], USAGE, error))]) as (client, _):
        response = call.start(client)
        received = []
        with pytest.raises(EventStreamError) as raised:
            for event in response[call.key]:
                received.append(event)
    assert_ended_by_the_exception_event(otel, call, received, raised.value)
    span = otel.span()
    assert [e.name for e in span.events] == ["exception"]
    assert span.events[0].attributes["exception.type"] == "botocore.exceptions.EventStreamError"  # type: ignore[index]


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
def test_connection_lost_mid_stream_is_recorded_by_class_name(otel: Captured, call: StreamCall) -> None:
    reply = wb.stream_reply(call.events(TOKENS, USAGE, None), drop_after=call.leading + 2)
    with bedrock([reply]) as (client, _):
        response = call.start(client)
        with pytest.raises(ProtocolError):
            list(response[call.key])
    otel.assert_finished("ProtocolError")
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 2


@pytest.mark.parametrize("call", STREAM_CALLS, ids=stream_ids)
def test_abandoned_stream_finishes_when_collected(otel: Captured, call: StreamCall) -> None:
    reply = wb.stream_reply(call.events(TOKENS, USAGE, None), delays=[0.0] * call.leading + [0.02])
    with bedrock([reply]) as (client, _):
        response = call.start(client)
        stream = iter(response[call.key])
        for _ in range(call.leading + 1):  # up to the first token
            next(stream)
        del response, stream
        gc.collect()
        otel.assert_abandoned_at_first_token()


# --- errors ------------------------------------------------------------------------------------------------------


def test_throttling_retries_stay_in_one_span_and_the_code_is_the_error_type(otel: Captured) -> None:
    with bedrock([wb.throttled("first-attempt"), wb.throttled("last-attempt")], attempts=2) as (client, server):
        with pytest.raises(client.exceptions.ThrottlingException) as raised:
            client.converse(modelId=MODEL, messages=MESSAGES)
        assert len(server.requests) == 2
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    span = otel.span()  # one span for the operation, botocore's retry inside it
    attrs = attributes(span)
    assert span.status.status_code is StatusCode.ERROR
    assert attrs[sc.ERROR_TYPE] == "ThrottlingException" and attrs[sc.ERROR_TYPE] in sc.RATE_LIMIT_ERROR_TYPES
    assert attrs[sc.RETRIES] == 1
    assert attrs[sc.AWS_REQUEST_ID] == "last-attempt"  # the request id of the response the caller got
    assert otel.point(sc.STABLE_NAMES.duration.name).attributes[sc.ERROR_TYPE] == "ThrottlingException"
    assert raised.value.__cause__ is None  # botocore's own exception, not one of ours


def test_a_retry_that_succeeds_is_one_ok_span(otel: Captured) -> None:
    body = wb.converse_body("Hi", usage=USAGE, latency_ms=5)
    with bedrock([wb.throttled("throttled"), wb.converse_reply(body, "answered")], attempts=2) as (client, server):
        client.converse(modelId=MODEL, messages=MESSAGES)
        assert len(server.requests) == 2
    attrs = attributes(otel.span())
    assert attrs[sc.RETRIES] == 1
    assert attrs[sc.AWS_REQUEST_ID] == "answered"
    assert sc.ERROR_TYPE not in attrs


@pytest.mark.parametrize(("status", "code", "error_class"), [
    (408, "ModelTimeoutException", "ModelTimeoutException"),
    (400, "ValidationException", "ValidationException"),
    # not in the service model: botocore raises a bare ClientError, the code still names the error
    (403, "UnrecognizedClientException", "ClientError"),
])
def test_error_responses_are_recorded_under_their_code(otel: Captured, status: int, code: str,
                                                       error_class: str) -> None:
    with bedrock([wb.error_reply(status, code, "no")]) as (client, _), pytest.raises(ClientError) as raised:
        client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi")))
    assert type(raised.value).__name__ == error_class
    otel.assert_finished(code)


# --- promises to the application -----------------------------------------------------------------------------------


def converse_once(server: wire.LoopbackServer, client: Any) -> None:
    server.push(wb.converse_reply(wb.converse_body("Hi", usage=USAGE, latency_ms=5)))
    client.converse(modelId=MODEL, messages=MESSAGES)


def test_clients_made_before_and_after_instrument_are_covered_and_uninstrument_is_exact(
        instrument: Instrument) -> None:
    targets = [(botocore.client.BaseClient, "_make_api_call"), (botocore.endpoint, "convert_to_response_dict"),
               (botocore.endpoint.Endpoint, "_needs_retry")]
    originals = [vars(owner)[name] for owner, name in targets]
    with wire.LoopbackServer() as server:
        before = wb.client(server)
        captured = instrument()
        after = wb.client(server)
        assert all(isinstance(vars(owner)[name], wrapt.FunctionWrapper) for owner, name in targets)
        converse_once(server, before)
        converse_once(server, after)
        assert len(captured.spans()) == 2
        otel_llm.uninstrument()
        assert [vars(owner)[name] for owner, name in targets] == originals
        converse_once(server, before)
    assert len(captured.spans()) == 2
    assert [t.attribute for t in bedrock_adapter.PROVIDER.targets] == [
        "BaseClient._make_api_call", "convert_to_response_dict", "Endpoint._needs_retry",
        "_BedrockRuntimeExtension.should_trace_service_call"]


def test_other_services_and_operations_pass_through_untouched(otel: Captured) -> None:
    replies = [wire.Reply.json({"modelSummaries": []}), wire.Reply.json({"inputTokens": 7})]
    with wire.LoopbackServer(replies) as server:
        models = wb.client(server, service="bedrock").list_foundation_models()  # the control plane, same protocol
        counted = wb.client(server).count_tokens(modelId=MODEL, input={"converse": {"messages": MESSAGES}})
    assert models["modelSummaries"] == [] and counted["inputTokens"] == 7
    assert otel.spans() == []
    assert otel.points(sc.STABLE_NAMES.duration.name) == []


@contextlib.contextmanager
def botocore_instrumentation() -> Iterator[Captured]:
    """OpenTelemetry's own botocore instrumentation (the real package), into exporters of its own."""
    from opentelemetry.instrumentation.botocore import BotocoreInstrumentor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    BotocoreInstrumentor().instrument(tracer_provider=tracer_provider,
                                      meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        yield Captured(exporter, reader, tracer_provider)
    finally:
        BotocoreInstrumentor().uninstrument()


def inference_and_other_calls(server: wire.LoopbackServer) -> None:
    """Each bedrock-runtime operation we record, and one we do not."""
    client = wb.client(server)
    converse_once(server, client)
    server.push(wb.stream_reply(wb.converse_stream(TOKENS, usage=USAGE)))
    list(client.converse_stream(modelId=MODEL, messages=MESSAGES)["stream"])
    server.push(wb.invoke_reply(CLAUDE.body(TOKENS, USAGE)))
    client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Say hello")))
    server.push(wb.stream_reply(wb.invoke_stream(CLAUDE.stream(TOKENS, USAGE), None)))
    list(client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(CLAUDE.request("Say hello")))["body"])
    server.push(wire.Reply.json({"inputTokens": 7}))
    client.count_tokens(modelId=MODEL, input={"converse": {"messages": MESSAGES}})


def gen_ai_points(captured: Captured) -> list[str]:
    return [name for name in captured.metrics() if name.startswith("gen_ai.")]


@pytest.mark.parametrize("ours_first", [True, False], ids=["ours-first", "theirs-first"])
def test_opentelemetrys_botocore_instrumentation_leaves_the_calls_we_record_to_us(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch, ours_first: bool) -> None:
    """Beside OpenTelemetry's botocore instrumentation (which opentelemetry-instrument loads after us) each inference
    call is one span and one set of GenAI points, ours; it still traces every other call. Without us, it records
    the inference calls again."""
    # restored as it was at the end: a wrapper of ours left inside theirs would outlive the test
    base = botocore.client.BaseClient
    monkeypatch.setattr(base, "_make_api_call", vars(base)["_make_api_call"])
    with contextlib.ExitStack() as stack:
        captured = instrument() if ours_first else None
        theirs = stack.enter_context(botocore_instrumentation())
        captured = captured or instrument()
        server = stack.enter_context(wire.LoopbackServer())
        inference_and_other_calls(server)
        assert [span.attributes[sc.OPERATION_NAME] for span in captured.spans()] == [sc.OP_CHAT] * 4
        assert sum(point.count for point in captured.points(sc.STABLE_NAMES.duration.name)) == 4
        assert [span.attributes["rpc.method"] for span in theirs.exporter.get_finished_spans()] == ["CountTokens"]
        assert gen_ai_points(theirs) == []

        otel_llm.uninstrument()
        inference_and_other_calls(server)
        assert len(captured.spans()) == 4
        their_spans = theirs.exporter.get_finished_spans()
        assert [span.attributes["rpc.method"] for span in their_spans] == [
            "CountTokens", "Converse", "ConverseStream", "InvokeModel", "InvokeModelWithResponseStream", "CountTokens"]
        assert gen_ai_points(theirs) != []
        # what their span of a call carries of the AWS SDK conventions, ours carried
        assert [aws_sdk_attributes(span) for span in captured.spans()] == [
            aws_sdk_attributes(span) for span in their_spans[1:5]]


def test_a_wrapper_of_ours_left_inside_theirs_leaves_each_call_to_the_round_recording_it(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ours, then theirs over it: our uninstrument() cannot take ours out from under theirs, so it stays on
    botocore's path. Instrumented again, over theirs, the new round records each call once and the old wrapper
    passes it through untouched: the caller's stream and body are botocore's, read once."""
    base = botocore.client.BaseClient
    monkeypatch.setattr(base, "_make_api_call", vars(base)["_make_api_call"])  # ours would outlive the test
    instrument()
    with botocore_instrumentation(), wire.LoopbackServer() as server:
        otel_llm.uninstrument()
        captured = instrument()
        inference_and_other_calls(server)
    assert [span.attributes[sc.RPC_METHOD] for span in captured.spans()] == [  # type: ignore[index]
        "Converse", "ConverseStream", "InvokeModel", "InvokeModelWithResponseStream"]
    assert attributes(captured.spans()[1])[sc.CONTENT_CHUNKS] == len(TOKENS)


def aws_sdk_attributes(span: ReadableSpan) -> dict[str, Any]:
    keys = (sc.RPC_SYSTEM, sc.RPC_SERVICE, sc.RPC_METHOD, sc.CLOUD_REGION, sc.AWS_REQUEST_ID)
    attrs = span.attributes or {}
    return {key: attrs.get(key) for key in keys}


def test_when_their_uninstrument_takes_our_wrapper_off_the_calls_are_theirs_again(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenTelemetry's uninstrument() takes off whichever wrapper is outermost: instrumented after it, ours. Its own
    wrapper stays on botocore's path, so it records the inference calls again: once, never by nobody."""
    from opentelemetry.instrumentation.botocore import BotocoreInstrumentor

    base = botocore.client.BaseClient
    monkeypatch.setattr(base, "_make_api_call", vars(base)["_make_api_call"])  # theirs would outlive the test
    with botocore_instrumentation() as theirs, wire.LoopbackServer() as server:
        captured = instrument()
        BotocoreInstrumentor().uninstrument()
        inference_and_other_calls(server)
    assert captured.spans() == []
    assert [span.attributes["rpc.method"] for span in theirs.exporter.get_finished_spans()] == [
        "Converse", "ConverseStream", "InvokeModel", "InvokeModelWithResponseStream", "CountTokens"]


def test_asked_from_a_coroutine_the_extension_leaves_aiobotocores_calls_to_us_where_we_wrapped_it(
        instrument: Instrument) -> None:
    """Were its aiobotocore path to ask its bedrock extension (0.66 has none for aiobotocore), it would ask from a
    coroutine: the call is aiobotocore's, ours to record where aiobotocore is installed (its venv runs this too), and
    its to trace where it is not, as we have wrapped nothing of it."""
    from opentelemetry.instrumentation.botocore.extensions.bedrock import _BedrockRuntimeExtension
    from opentelemetry.instrumentation.botocore.extensions.types import _AwsSdkCallContext

    instrument()
    with wire.LoopbackServer() as server:
        extension = _BedrockRuntimeExtension(_AwsSdkCallContext(wb.client(server), ("Converse", {})))

    async def asked_by_aiobotocore() -> bool:
        return extension.should_trace_service_call()

    assert extension.should_trace_service_call() is False
    assert asyncio.run(asked_by_aiobotocore()) is (importlib.util.find_spec("aiobotocore") is None)


def test_the_caller_gets_what_boto3_gives_without_us(instrument: Instrument) -> None:
    def calls(client: Any) -> list[Any]:
        converse = client.converse(modelId=MODEL, messages=MESSAGES)
        stream = client.converse_stream(modelId=MODEL, messages=MESSAGES)
        invoked = client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi")))
        streamed = client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi")))
        results = [converse, stream, invoked, streamed]
        for result in results:
            result["ResponseMetadata"]["HTTPHeaders"].pop("date")
        return [converse, {**stream, "stream": list(stream["stream"])},
                {**invoked, "body": invoked["body"].read()}, {**streamed, "body": list(streamed["body"])}]

    def replies() -> list[wire.Reply]:
        return [wb.converse_reply(wb.converse_body("Hi", usage=USAGE, latency_ms=5)),
                wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None)),
                wb.invoke_reply(CLAUDE.body(TOKENS, USAGE), wb.invocation_headers(USAGE, latency_ms=9)),
                wb.stream_reply(INVOKE_CLAUDE_STREAM.events(TOKENS, USAGE, None))]

    with bedrock(replies()) as (client, _):
        without = calls(client)
    captured = instrument()
    with bedrock(replies()) as (client, _):
        assert calls(client) == without
    assert len(captured.spans()) == 4


@pytest.mark.parametrize("given", ["bytes", "a file", "a file past its start"])
def test_invoke_models_request_body_is_read_from_a_file_as_from_bytes(instrument: Instrument, given: str) -> None:
    """botocore sends a file object's body from where it stands, and rewinds it to sign and to retry (it refuses one
    that cannot seek): we read it the same way and put it back, so its span is the one its bytes give, and the
    server gets the same bytes."""
    request = json.dumps(CLAUDE.request("Say hello")).encode()
    lead = b"ignored by botocore"

    def call(client: Any) -> Any:
        body: Any = {"bytes": request, "a file": io.BytesIO(request)}.get(given)
        if given == "a file past its start":
            body = io.BytesIO(lead + request)
            body.seek(len(lead))
        client.invoke_model(modelId=MODEL, body=body)["body"].read()
        return body

    otel = instrument()
    with bedrock([wb.invoke_reply(CLAUDE.body(TOKENS, USAGE))]) as (client, server):
        body = call(client)
    assert server.requests[0].body == request
    if isinstance(body, io.BytesIO):
        assert body.tell() == len(body.getvalue())  # where botocore leaves it, as without us
    attrs = attributes(otel.span())
    assert attrs[sc.OPERATION_NAME] == sc.OP_CHAT and attrs[sc.REQUEST_MAX_TOKENS] == 256
    assert attrs[sc.PROMPT_LENGTH] == PROMPT_CHARS


def test_invoke_models_body_keeps_botocores_behaviour(instrument: Instrument) -> None:
    """We read the body within the call and hand over one that replays it: it reads, closes and takes a socket
    timeout as botocore's own does, and keeps the length the header gave (botocore's text of it)."""
    def use(client: Any) -> list[Any]:
        body = client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi")))["body"]
        body.set_socket_timeout(5)
        return [body._content_length, body.readable(), body.read(5), body.read(), body.close(), body.read(),
                body.readable()]

    reply = wb.invoke_reply(CLAUDE.body(TOKENS, USAGE))
    with bedrock([reply]) as (client, _):
        without = use(client)
    captured = instrument()
    with bedrock([reply]) as (client, _):
        assert use(client) == without
    assert attributes(captured.span())[sc.USAGE_OUTPUT_TOKENS] == 3


def test_a_body_cut_off_in_transfer_fails_at_read_as_without_us(otel: Captured) -> None:
    """The call returns; reading the body raises, as botocore's would: the operation records that error."""
    sent = wb.invoke_reply(CLAUDE.body(TOKENS, USAGE))
    cut = wire.Reply(sent.status, sent.body, sent.headers, drop_after=0)
    with bedrock([cut]) as (client, _):
        body = client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi")))["body"]
        body.set_socket_timeout(5)  # as on any body botocore hands over
        with pytest.raises(ResponseStreamingError):
            body.read()
    otel.assert_finished("ResponseStreamingError")


def test_what_a_stubber_hands_over_is_the_callers_as_it_is(otel: Captured) -> None:
    """botocore's Stubber takes bytes or a BytesIO for invoke_model's body, and no stream at all for a stream: the
    caller gets them as stubbed, unread, and each call is still one span."""
    client = boto3.client("bedrock-runtime", region_name=wb.REGION, aws_access_key_id="test",
                          aws_secret_access_key="test")
    sent = json.dumps(CLAUDE.body(TOKENS, USAGE)).encode()
    request = json.dumps(CLAUDE.request("Hi"))
    with Stubber(client) as stub:
        stub.add_response("invoke_model", {"body": sent, "contentType": "application/json"})
        stub.add_response("invoke_model", {"body": io.BytesIO(sent), "contentType": "application/json"})
        stub.add_response("converse_stream", {})
        assert client.invoke_model(modelId=MODEL, body=request)["body"] == sent
        stubbed = client.invoke_model(modelId=MODEL, body=request)["body"]
        assert isinstance(stubbed, io.BytesIO) and stubbed.tell() == 0 and stubbed.getvalue() == sent
        assert client.converse_stream(modelId=MODEL, messages=MESSAGES) == {}
    assert [dict(span.attributes or {}).get(sc.ERROR_TYPE) for span in otel.spans()] == [None, None, None]


def test_a_stream_shows_botocores_own_repr(otel: Captured) -> None:
    with bedrock([wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]) as (client, _):
        stream = client.converse_stream(modelId=MODEL, messages=MESSAGES)["stream"]
        assert re.fullmatch(r"<botocore\.eventstream\.EventStream object at 0x[0-9a-f]+>", repr(stream))
        assert len(list(stream)) == 7
    otel.assert_finished(None)


def test_a_copy_of_a_stream_reads_on_in_the_same_operation(otel: Captured) -> None:
    """copy.copy() of botocore's EventStream shares its events: what is read through the copy is the same stream."""
    with bedrock([wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]) as (client, _):
        stream = client.converse_stream(modelId=MODEL, messages=MESSAGES)["stream"]
        first = next(iter(stream))
        twin = copy.copy(stream)
        assert isinstance(twin, EventStream) and twin is not stream
        del stream
        gc.collect()
        assert otel.spans() == []
        events = [first, *twin]
        assert len(events) == 7
        assert [e["contentBlockDelta"]["delta"]["text"] for e in events if "contentBlockDelta" in e] == TOKENS
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 3


def test_an_event_stream_is_iterable_only_as_botocores_own(instrument: Instrument) -> None:
    """botocore's EventStream is neither an iterator nor a context manager: next() and with fail on it with a
    TypeError, with us as without, so a program that runs instrumented runs without us too."""
    def misuse() -> str:
        with bedrock([wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]) as (client, _):
            stream = client.converse_stream(modelId=MODEL, messages=MESSAGES)["stream"]
            with pytest.raises(TypeError, match="not an iterator"):
                next(stream)
            with pytest.raises(TypeError, match="context manager") as raised, stream:
                pass
            assert len(list(stream)) == 7  # and iterated, it reads on as ever
            return str(raised.value)

    without = misuse()
    otel = instrument()
    assert misuse() == without
    otel.assert_finished(None)


def test_pickling_a_stream_fails_as_botocores_own(instrument: Instrument) -> None:
    def refusal() -> tuple[type[BaseException], str]:
        with bedrock([wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]) as (client, _):
            stream = client.converse_stream(modelId=MODEL, messages=MESSAGES)["stream"]
            error = pickling_error(stream)
            stream.close()
            return error

    without = refusal()
    assert without[0] is TypeError
    otel = instrument()
    assert refusal() == without
    assert len(otel.spans()) == 1


def test_a_session_token_a_signature_error_quotes_is_not_recorded(otel: Captured) -> None:
    """A SigV4 mismatch quotes the canonical request it computed, the session token among its signed headers."""
    token = "IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN"
    text = ("The request signature we calculated does not match the signature you provided. The Canonical String "
            f"for this request should have been\n'POST\n/model/m/converse\n\nhost:127.0.0.1\nx-amz-security-token:"
            f"{token}\n\nhost;x-amz-security-token\n'")
    with wire.LoopbackServer([wb.error_reply(403, "InvalidSignatureException", text)]) as server:
        client = boto3.client("bedrock-runtime", endpoint_url=wb.endpoint_url(server), region_name=wb.REGION,
                              aws_access_key_id="test", aws_secret_access_key="test", aws_session_token=token,
                              config=botocore.config.Config(retries={"total_max_attempts": 1}))
        with pytest.raises(ClientError, match=token):
            client.converse(modelId=MODEL, messages=MESSAGES)
    (event,) = otel.span().events
    assert event.attributes is not None and "x-amz-security-token:[REDACTED]" in str(
        event.attributes["exception.message"])
    assert token not in otel.span().to_json()


def test_a_suppressed_call_gets_botocores_own_objects(otel: Captured) -> None:
    replies = [wb.invoke_reply(CLAUDE.body(TOKENS, USAGE)),
               wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]
    with bedrock(replies) as (client, _), suppress_instrumentation():
        body = client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Hi")))["body"]
        stream = client.converse_stream(modelId=MODEL, messages=MESSAGES)["stream"]
        assert type(body._raw_stream).__name__ == "HTTPResponse"  # botocore's, unread by us
        assert type(stream) is EventStream
        assert len(list(stream)) > 0 and body.read() == replies[0].body
    assert otel.spans() == []


def test_span_is_current_only_while_botocore_sends(otel: Captured) -> None:
    seen_by_botocore = []
    with bedrock([wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]) as (client, _):
        client.meta.events.register(
            "before-send.bedrock-runtime.ConverseStream",
            lambda **kwargs: seen_by_botocore.append(trace.get_current_span().get_span_context().span_id))
        tracer = otel.tracer_provider.get_tracer("app")
        with tracer.start_as_current_span("handler") as outer:
            response = CONVERSE_STREAM.start(client)
            assert trace.get_current_span() is outer  # not leaked into the caller's code
            list(response["stream"])
    llm = next(s for s in otel.spans() if s.name == f"chat {MODEL}")
    assert seen_by_botocore == [llm.context.span_id]  # an HTTP client span would be its child
    assert llm.parent is not None and llm.parent.span_id == outer.get_span_context().span_id


def test_our_failure_on_an_odd_chunk_is_swallowed_and_logged_once(
        otel: Captured, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_safety, "strict", False)
    monkeypatch.setattr(_safety, "_reported", set())
    odd = wb.event("chunk", {"bytes": "bm90IGpzb24="})  # base64 of "not json": the model's JSON is not JSON
    events = INVOKE_LLAMA_STREAM.events(TOKENS, USAGE, None)
    with bedrock([wb.stream_reply([events[0], odd, odd, *events[1:]])]) as (client, _), \
            caplog.at_level(logging.WARNING, logger="otel_llm"):
        received = list(INVOKE_LLAMA_STREAM.start(client)["body"])
    assert len(received) == len(events) + 2  # every event reached the caller
    assert [r.message for r in caplog.records].count(
        "otel_llm: internal failure in stream chunk; telemetry for this call is incomplete") == 1
    assert otel.span().status.status_code is StatusCode.UNSET


def test_unsampled_tracer_still_records_metrics(instrument: Instrument) -> None:
    captured = instrument(sampler=ALWAYS_OFF)
    with bedrock([wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]) as (client, _):
        list(CONVERSE_STREAM.start(client)["stream"])
    assert captured.spans() == []
    assert captured.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


def test_no_content_and_no_credentials_by_default(otel: Captured) -> None:
    with bedrock([wb.stream_reply(CONVERSE_STREAM.events(TOKENS, USAGE, None))]) as (client, _):
        list(client.converse_stream(modelId=MODEL, messages=[{"role": "user", "content": [{"text": "my plan"}]}])[
            "stream"])
    recorded = json.dumps({**attributes(otel.span())}, default=str)
    recorded += json.dumps([dict(p.attributes) for points in otel.metrics().values() for p in points])
    assert "my plan" not in recorded and "Hel" not in recorded
    assert "Credential" not in recorded and "Signature" not in recorded
