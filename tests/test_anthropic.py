"""The real anthropic client, over its own httpx2 transport and over a loopback socket: one span per operation with
whole metric points, every way a stream can finish, the messages.stream() helper exactly as without us, raw and
streaming responses, 429/529 with retries, the Bedrock and Vertex clients, and the SDK's own span folded into ours."""

from __future__ import annotations

import asyncio
import datetime
import gc
import itertools
import json
import random
import sys
import time
import types
import warnings
from typing import Any

import anthropic
import httpx2
import pydantic
import pytest
import wire
import wire_anthropic as wa
import wire_bedrock as wb
import wrapt
from conftest import Captured, Instrument, Received, assert_read_alike_and_recorded, attributes, cancel_midway, received
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import otel_llm
from otel_llm import _semconv as sc
from otel_llm.providers import anthropic as anthropic_adapter

API_KEY = "sk-ant-api03-test-secret"
BASE_URL = "https://api.anthropic.com"
MODEL = "claude-haiku-4-5"  # an alias; the response names the snapshot, wa.MODEL
TOKENS = ["Hel", "lo", " world"]
USAGE = wa.Usage(input=20, output=3, cache_read=100, cache_creation=8)
INPUT_TOKENS = 20 + 100 + 8  # the conventions count cache reads and writes as input
SYSTEM = "Be brief."
MESSAGES = [{"role": "user", "content": "Say hello"}]
PROMPT_CHARS = len(SYSTEM) + len("Say hello")
REQUEST: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "system": SYSTEM, "messages": MESSAGES}
# (limit, remaining) per resource; the header names spell the same words with "-"
LIMITS = {sc.RATE_LIMIT_REQUESTS: (50, 49), sc.RATE_LIMIT_TOKENS: (90_000, 89_000),
          sc.RATE_LIMIT_INPUT_TOKENS: (80_000, 79_900), sc.RATE_LIMIT_OUTPUT_TOKENS: (10_000, 9_990)}
MS = 1e-3
# what the reply to REQUEST tells, streamed or not
RESPONSE_ATTRIBUTES = {
    sc.RESPONSE_ID: wa.MESSAGE_ID,
    sc.RESPONSE_MODEL: wa.MODEL,
    sc.RESPONSE_FINISH_REASONS: ("end_turn",),
    sc.USAGE_INPUT_TOKENS: INPUT_TOKENS,
    sc.USAGE_OUTPUT_TOKENS: 3,
    sc.USAGE_CACHE_READ_INPUT_TOKENS: 100,
    sc.USAGE_CACHE_CREATION_INPUT_TOKENS: 8,
}


def sync_client(replies: wire.ReplySource, **options: Any) -> tuple[anthropic.Anthropic, wire.Recorder]:
    http, recorder = wire.mock_client(replies)
    options = {"max_retries": 0, **options}
    return anthropic.Anthropic(api_key=API_KEY, base_url=BASE_URL, http_client=http, **options), recorder


def async_client(replies: wire.ReplySource, **options: Any) -> tuple[anthropic.AsyncAnthropic, wire.Recorder]:
    http, recorder = wire.mock_client(replies, async_=True)
    options = {"max_retries": 0, **options}
    return anthropic.AsyncAnthropic(api_key=API_KEY, base_url=BASE_URL, http_client=http, **options), recorder


def create(is_async: bool, replies: wire.ReplySource, **kwargs: Any) -> tuple[Any, wire.Recorder]:
    """messages.create as an application calls it; a stream is read to its end."""
    if is_async:
        client, recorder = async_client(replies)

        async def go() -> Any:
            result = await client.messages.create(**kwargs)
            return [event async for event in result] if kwargs.get("stream") else result

        return asyncio.run(go()), recorder
    sync, recorder = sync_client(replies)
    result = sync.messages.create(**kwargs)
    return (list(result) if kwargs.get("stream") else result), recorder


def text_stream(**reply: Any) -> wire.Reply:
    return wa.stream_reply(wa.text_events(TOKENS, usage=USAGE), **reply)


def base_attributes() -> dict[str, Any]:
    return {sc.OPERATION_NAME: sc.OP_CHAT, sc.PROVIDER_NAME: sc.PROVIDER_ANTHROPIC, sc.REQUEST_MODEL: MODEL,
            sc.SERVER_ADDRESS: "api.anthropic.com", sc.SERVER_PORT: 443}


def rate_limit_attributes(limits: dict[str, tuple[int, int]]) -> dict[str, float]:
    found: dict[str, float] = {}
    for resource, (limit, remaining) in limits.items():
        found[sc.RATE_LIMIT_LIMIT_PREFIX + resource] = limit
        found[sc.RATE_LIMIT_REMAINING_PREFIX + resource] = remaining
    return found




# --- one span, whole metric points -------------------------------------------------------------------------------


@pytest.mark.usefixtures("steady_clock")
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_streamed_message_is_one_span_with_latency_usage_and_headroom(otel: Captured, is_async: bool) -> None:
    # 20 ms to the headers, then 10 ms before each of message_start, content_block_start and ping: 50 ms of events
    # that carry no output, then 30 ms more to the first text delta and 10 ms between deltas
    reply = text_stream(headers_delay=0.02, delays=[0.01, 0.01, 0.01, 0.03, 0.01, 0.01],
                        headers=wa.ratelimit_headers(**LIMITS))
    events, recorder = create(is_async, [reply], **REQUEST, stream=True, stop_sequences=["\n\nHuman:"])

    assert [e.type for e in events] == ["message_start", "content_block_start", *["content_block_delta"] * 3,
                                        "content_block_stop", "message_delta", "message_stop"]
    assert recorder.requests[0].json["stream"] is True
    span = otel.span()
    assert span.name == f"chat {MODEL}"
    assert span.kind is SpanKind.CLIENT
    assert span.instrumentation_scope is not None and span.instrumentation_scope.name == sc.INSTRUMENTATION_SCOPE
    assert span.status.status_code is StatusCode.UNSET
    attrs = dict(attributes(span))
    timings = {key: attrs.pop(key) for key in (sc.RESPONSE_TIME_TO_FIRST_CHUNK, sc.MAX_CHUNK_GAP,
                                                 sc.TIME_PER_OUTPUT_TOKEN, sc.TIME_TO_HEADERS)}
    assert attrs == {
        **base_attributes(),
        sc.REQUEST_STREAM: True,
        sc.PROMPT_LENGTH: PROMPT_CHARS,
        sc.REQUEST_MAX_TOKENS: 64,
        sc.REQUEST_STOP_SEQUENCES: ("\n\nHuman:",),
        **RESPONSE_ATTRIBUTES,
        sc.CONTENT_CHUNKS: 3,
        **rate_limit_attributes(LIMITS),
    }
    # the first text delta, 60 ms of body after the headers, is the first token: message_start came after 10 ms.
    # (A cold client adds its first-parse costs on top; the loopback test below checks agreement within 1 ms.)
    assert timings[sc.TIME_TO_HEADERS] >= 0.02
    assert timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK] >= timings[sc.TIME_TO_HEADERS] + 0.06
    assert 0.01 <= timings[sc.MAX_CHUNK_GAP] < 0.02
    assert timings[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(0.01, abs=0.004)

    metric_attrs = {**base_attributes(), sc.RESPONSE_MODEL: wa.MODEL}
    timing_attrs = {**metric_attrs, sc.REQUEST_STREAM: True, sc.PROMPT_SIZE: "<1k"}
    names = sc.STABLE_NAMES
    duration = otel.point(names.duration.name)
    assert dict(duration.attributes) == timing_attrs
    assert duration.count == 1 and duration.sum >= timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK] + 0.02
    ttfc = otel.point(names.time_to_first_chunk.name)
    assert dict(ttfc.attributes) == timing_attrs
    assert ttfc.count == 1 and ttfc.sum == pytest.approx(timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK], abs=1e-9)
    gaps = otel.point(names.time_per_output_chunk.name)
    assert dict(gaps.attributes) == metric_attrs
    assert gaps.count == 2 and gaps.sum == pytest.approx(0.02, abs=0.006)
    tpot = otel.point(names.time_per_output_token.name)
    assert tpot.count == 1 and tpot.sum == pytest.approx(timings[sc.TIME_PER_OUTPUT_TOKEN], abs=1e-9)
    usage_name = names.token_usage.name  # type: ignore[union-attr]
    assert dict(otel.point(usage_name, gen_ai__token__type="input").attributes) == {
        **metric_attrs, sc.TOKEN_TYPE: "input"}
    assert otel.point(usage_name, gen_ai__token__type="input").sum == INPUT_TOKENS
    assert otel.point(usage_name, gen_ai__token__type="output").sum == 3
    prompt = otel.point(names.prompt_length.name)
    assert (prompt.count, prompt.sum) == (1, PROMPT_CHARS)
    for resource, (limit, remaining) in LIMITS.items():
        point = otel.point(names.rate_limit_remaining.name, otel_llm__rate_limit__resource=resource)
        # headroom describes the endpoint and model, not one call's outcome
        assert dict(point.attributes) == {**base_attributes(), sc.RATE_LIMIT_RESOURCE: resource}
        assert point.value == remaining
        assert otel.point(names.rate_limit_limit.name, otel_llm__rate_limit__resource=resource).value == limit


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_plain_message_records_duration_and_usage_but_no_stream_metrics(otel: Captured, is_async: bool) -> None:
    message, recorder = create(is_async, [wa.json_reply(wa.message_body("Hello world", usage=USAGE))], **REQUEST)

    assert message.content[0].text == "Hello world"
    assert "stream" not in recorder.requests[0].json
    span = otel.span()
    attrs = dict(attributes(span))
    assert attrs.pop(sc.TIME_TO_HEADERS) > 0
    assert attrs == {
        **base_attributes(),
        sc.REQUEST_STREAM: False,
        sc.PROMPT_LENGTH: PROMPT_CHARS,
        sc.REQUEST_MAX_TOKENS: 64,
        **RESPONSE_ATTRIBUTES,
    }
    names = sc.STABLE_NAMES
    assert set(otel.metrics()) == {names.duration.name, names.token_usage.name,  # type: ignore[union-attr]
                                   names.prompt_length.name}
    duration = otel.point(names.duration.name)
    assert dict(duration.attributes) == {**base_attributes(), sc.RESPONSE_MODEL: wa.MODEL, sc.REQUEST_STREAM: False,
                                         sc.PROMPT_SIZE: "<1k"}
    assert span.start_time is not None and span.end_time is not None
    assert duration.sum == pytest.approx((span.end_time - span.start_time) / 1e9, abs=1e-6)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_thinking_and_tool_input_deltas_are_content_signatures_are_not(otel: Captured, is_async: bool) -> None:
    usage = wa.Usage(input=50, output=40, cache_read=10, thinking=12)
    # the API repeats the cumulative input counts in message_delta: they are not added twice
    events = wa.message_events([("thinking", ["Let me", " check"]), ("tool_use", ['{"city":', ' "Paris"}'])],
                               usage=usage, cumulative_input=True)
    received, _ = create(is_async, [wa.stream_reply(events, delays=[0.0, 0.0, 0.0, 0.03])], **REQUEST, stream=True)

    assert [e.delta.type for e in received if e.type == "content_block_delta"] == [
        "thinking_delta", "thinking_delta", "signature_delta", "input_json_delta", "input_json_delta",
        "input_json_delta"]
    attrs = attributes(otel.span())
    # two thinking deltas and two argument pieces: the signature and the API's empty opening partial_json carry none
    assert attrs[sc.CONTENT_CHUNKS] == 4
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] >= 0.03  # the first thinking delta came after the 30 ms pause
    assert attrs[sc.RESPONSE_FINISH_REASONS] == ("tool_use",)
    assert attrs[sc.USAGE_INPUT_TOKENS] == 60
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 40
    assert attrs[sc.USAGE_REASONING_OUTPUT_TOKENS] == 12


@pytest.mark.parametrize("helper", [False, True], ids=["create", "stream()"])
def test_sampling_parameters_sent_in_extra_body_are_on_the_span_as_doubles(otel: Captured, helper: bool) -> None:
    """anthropic 2.15 takes temperature, top_p and top_k no more as arguments: a caller sends them in extra_body,
    and they are what the conventions name, as doubles (top_k too, in v1.41)."""
    sampling = {"temperature": 0, "top_p": 0.9, "top_k": 40}
    client, recorder = sync_client([wa.stream_reply(wa.text_events(TOKENS, usage=USAGE))])
    if helper:
        with client.messages.stream(**REQUEST, extra_body=sampling) as stream:
            stream.until_done()
    else:
        list(client.messages.create(**REQUEST, stream=True, extra_body=sampling))
    assert {key: recorder.requests[0].json[key] for key in sampling} == sampling
    attrs = attributes(otel.span())
    recorded = {name: attrs[name] for name in (sc.REQUEST_TEMPERATURE, sc.REQUEST_TOP_P, sc.REQUEST_TOP_K)}
    assert recorded == {sc.REQUEST_TEMPERATURE: 0.0, sc.REQUEST_TOP_P: 0.9, sc.REQUEST_TOP_K: 40.0}
    assert all(type(value) is float for value in recorded.values())


@pytest.mark.timing  # TPOT from pauses of 20 ms, within a quarter
def test_streamed_thinking_tokens_count_in_time_per_output_token(otel: Captured) -> None:
    """Thinking deltas are streamed output: TPOT spreads over every output token, thinking ones included."""
    usage = wa.Usage(input=5, output=41, thinking=20)
    events = wa.message_events([("thinking", ["a", "b"]), ("text", ["c", "d"])], usage=usage)
    # after the first thinking delta, three content deltas 20 ms apart (signature and block events between)
    create(False, [wa.stream_reply(events, delays=[0, 0, 0, 0, 0.02, 0, 0, 0, 0.02, 0.02])], **REQUEST, stream=True)
    assert attributes(otel.span())[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(0.06 / 40, rel=0.25)


@pytest.mark.parametrize("counted", [True, False], ids=["thinking counted", "thinking not counted"])
@pytest.mark.parametrize("hidden", ["thinking", "redacted_thinking"], ids=["omitted", "redacted"])
@pytest.mark.timing  # TPOT from pauses of 20 ms, within 4 ms
def test_time_per_output_token_leaves_out_thinking_the_stream_hid(otel: Captured, hidden: str, counted: bool) -> None:
    """Thinking omitted (its block carries a signature alone) or redacted never streams. The usage's thinking count
    takes its 2000 tokens out of the 2005 output tokens, and TPOT times the answer's 5, 20 ms apart; without that
    count the answer's own is unknown: no TPOT, rather than a spread over 2005 tokens."""
    usage = wa.Usage(input=5, output=2005, thinking=2000 if counted else None)
    events = wa.message_events([(hidden, []), ("text", list("abcde"))], usage=usage)
    first_text = next(i for i, (_, e) in enumerate(events) if e.get("delta", {}).get("type") == "text_delta")
    create(False, [wa.stream_reply(events, delays=[0.0] * first_text + [0.05] + [0.02] * 4)], **REQUEST, stream=True)
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == 5
    if counted:
        assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(0.02, abs=0.004)
    else:
        assert sc.TIME_PER_OUTPUT_TOKEN not in attrs
        assert otel.points(sc.STABLE_NAMES.time_per_output_token.name) == []


def test_streams_with_odd_values_anywhere_reach_the_caller_unchanged_and_are_recorded(
        instrument: Instrument, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """200 message streams of text, thinking, redacted thinking and tool input (a seeded draw), each with values of
    another type or missing anywhere in its events. What the caller gets (every event, or the client's own
    exception) is what it gets without us; every call still ends in one span and one duration; and our only failures
    are events we could not read (logged, skipped). As for openai's chat in tests/test_contract.py."""
    rng = random.Random(5)
    shapes = [[("text", ["a", "b", "c"])], [("thinking", ["x", "y"]), ("text", ["a", "b"])],
              [("tool_use", ['{"a":', "1}"])], [("redacted_thinking", []), ("text", ["a"])]]
    cases = [[(name, wire.oddly(data, rng) if rng.random() < 0.35 else data) for name, data in wa.message_events(
        rng.choice(shapes), usage=wa.Usage(input=3, output=5, thinking=rng.choice([None, 2])))] for _ in range(200)]

    def read(events: list[tuple[str, Any]]) -> Received:
        client, _ = sync_client([wa.stream_reply(events)])
        return received(lambda: client.messages.create(**REQUEST, stream=True))

    assert_read_alike_and_recorded(instrument, monkeypatch, caplog, cases, read, [read(events) for events in cases])


def _read_until_cut() -> tuple[list[str], BaseException]:
    """The event types a caller reads of a stream whose connection is lost after four events, and what it raises."""
    client, _ = sync_client([text_stream(drop_after=4)])
    received = []
    with pytest.raises(Exception) as raised:
        for event in client.messages.create(**REQUEST, stream=True):
            received.append(event.type)
    return received, raised.value


def test_stream_cut_before_message_delta_reports_no_output_tokens(otel: Captured) -> None:
    # message_start says output_tokens: 1, a placeholder: unknown stays unset
    _read_until_cut()
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_INPUT_TOKENS] == INPUT_TOKENS
    assert sc.USAGE_OUTPUT_TOKENS not in attrs
    assert sc.TIME_PER_OUTPUT_TOKEN not in attrs


def test_prompt_length_counts_text_of_blocks_and_of_a_response_passed_back(otel: Captured) -> None:
    client, _ = sync_client([wa.json_reply(wa.message_body("Hello world", usage=USAGE))] * 2)
    first = client.messages.create(**REQUEST)
    system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    messages = [
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "text", "text": "What is this?"},
        ]},
        {"role": "assistant", "content": first.content},  # TextBlock objects, as applications pass them back
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": wa.TOOL_USE_ID, "content": "18 C"}]},
    ]
    client.messages.create(model=MODEL, max_tokens=64, system=system, messages=messages)  # type: ignore[arg-type]
    second = otel.spans()[1]
    assert attributes(second)[sc.PROMPT_LENGTH] == len("You are terse.What is this?Hello world18 C")


def test_prompt_length_counts_earlier_tool_calls_input_as_the_json_sent(otel: Captured) -> None:
    """A tool loop sends the model's earlier tool_use blocks back: their input is JSON the model reads, counted as
    the client writes it (compact, unescaped), whether passed back as the client's block or as a dict; the tool's
    name and id are not text of the conversation."""
    called = {**wa.message_body("", usage=USAGE, stop_reason="tool_use"), "content": [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": wa.TOOL_USE_ID, "name": wa.TOOL_NAME, "input": {"city": "Zürich", "days": 2}}]}
    client, server = sync_client([wa.json_reply(called)] + [wa.json_reply(wa.message_body("Mild", usage=USAGE))] * 2)
    first = client.messages.create(**REQUEST)
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": wa.TOOL_USE_ID, "content": "18 C"}]}
    as_returned = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": first.content}, result]
    as_dicts = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [block.model_dump() for block in first.content]}, result]
    for messages in (as_returned, as_dicts):
        client.messages.create(model=MODEL, max_tokens=64, messages=messages)  # type: ignore[arg-type]
    sent = json.loads(server.requests[1].body)["messages"][1]["content"][1]["input"]
    assert json.dumps(sent, ensure_ascii=False, separators=(",", ":")) == '{"city":"Zürich","days":2}'
    expected = len("Weather?") + len("Checking.") + len('{"city":"Zürich","days":2}') + len("18 C")
    assert [attributes(span)[sc.PROMPT_LENGTH] for span in otel.spans()[1:]] == [expected, expected]


def test_prompt_length_counts_a_tool_input_json_cannot_write_as_the_client_sends_it(otel: Captured) -> None:
    # the client writes a date as text; a value it cannot send at all (circular) is the client's to refuse
    client, server = sync_client([wa.json_reply(wa.message_body("Mild", usage=USAGE))])

    def create(tool_input: dict[str, Any]) -> None:
        client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "assistant", "content": [
            {"type": "tool_use", "id": wa.TOOL_USE_ID, "name": wa.TOOL_NAME, "input": tool_input}]}])

    create({"day": datetime.date(2026, 1, 2)})
    circular: dict[str, Any] = {"note": "x"}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular reference"):
        create(circular)
    assert json.loads(server.requests[0].body)["messages"][0]["content"][0]["input"] == {"day": "2026-01-02"}
    assert [attributes(span).get(sc.PROMPT_LENGTH) for span in otel.spans()] == [len('{"day":"2026-01-02"}'), 0]


# --- every way a stream finishes ---------------------------------------------------------------------------------


def test_exhausted_stream_finishes_without_error(otel: Captured) -> None:
    client, _ = sync_client([text_stream()])
    stream = client.messages.create(**REQUEST, stream=True)
    assert isinstance(stream, anthropic.Stream)
    assert stream.response.status_code == 200
    assert len(list(stream)) == 8
    stream.close()  # closing after the end changes nothing
    otel.assert_finished(None)


def test_break_then_close_is_cancelled_and_keeps_what_was_measured(otel: Captured) -> None:
    client, _ = sync_client([text_stream(delays=[0, 0, 0, 0, 0.01, 0.01])])
    stream = client.messages.create(**REQUEST, stream=True)
    for event in stream:
        if event.type == "content_block_delta" and event.delta.text == "lo":
            break
    assert otel.spans() == []  # still open: the caller may come back to it
    stream.close()
    otel.assert_finished(sc.ERROR_CANCELLED)
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 2
    assert otel.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


@pytest.mark.parametrize("stop_at", ["message_delta", "message_stop"])
def test_a_caller_that_stops_once_the_message_is_complete_has_not_cancelled(otel: Captured, stop_at: str) -> None:
    """message_delta carries the stop reason and the final usage; leaving there (or at message_stop) in a with
    block ends the operation where the message completed, without error."""
    client, _ = sync_client([text_stream()])
    start = time.perf_counter()
    with client.messages.create(**REQUEST, stream=True) as stream:
        for event in stream:
            if event.type == stop_at:
                break
        time.sleep(0.05)  # the caller's own work after the output: not the operation's
    elapsed = time.perf_counter() - start
    otel.assert_finished(None)
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == USAGE.output
    assert attrs[sc.RESPONSE_FINISH_REASONS] == ("end_turn",)
    assert otel.point(sc.STABLE_NAMES.duration.name).sum < elapsed - 0.04  # ended where the message completed


def test_with_block_exit_closes_the_stream(otel: Captured) -> None:
    client, _ = sync_client([text_stream()])
    with client.messages.create(**REQUEST, stream=True) as stream:
        assert next(iter(stream)).type == "message_start"
    assert stream.response.is_closed
    otel.assert_finished(sc.ERROR_CANCELLED)


def test_with_block_after_the_end_is_not_an_error(otel: Captured) -> None:
    client, _ = sync_client([text_stream()])
    with client.messages.create(**REQUEST, stream=True) as stream:
        assert len(list(stream)) == 8
    otel.assert_finished(None)


def test_connection_lost_mid_stream_passes_through_and_is_recorded(instrument: Instrument) -> None:
    # anthropic up to 2.16 passed the transport's error on; 2.17 raises its APIConnectionError from it: as without
    # us, whichever the installed client does
    read, error = _read_until_cut()
    assert read == ["message_start", "content_block_start", "content_block_delta"]
    assert isinstance(error, httpx2.RemoteProtocolError) or (
        type(error) is anthropic.APIConnectionError and type(error.__cause__) is httpx2.RemoteProtocolError)
    otel = instrument()
    read_with_us, ours = _read_until_cut()
    assert read_with_us == read
    assert (type(ours), type(ours.__cause__), str(ours)) == (type(error), type(error.__cause__), str(error))
    otel.assert_finished(type(error).__name__)
    assert [event.name for event in otel.span().events] == ["exception"]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_error_event_mid_stream_is_the_sdks_error_named_as_before_a_stream(otel: Captured, is_async: bool) -> None:
    events = [*wa.sse(wa.text_events(TOKENS, usage=USAGE))[:5], wa.error_event("overloaded_error", "Overloaded")]
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error") as raised:
        create(is_async, [wire.Reply.stream(events)], **REQUEST, stream=True)
    # the stream was a 200, so anthropic raises its base status error carrying the API's type, not OverloadedError;
    # error.type is what a 529 before the stream is recorded as, so one query counts both
    assert type(raised.value) is anthropic.APIStatusError and raised.value.type == "overloaded_error"
    otel.assert_finished("OverloadedError")
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 2  # what came before the error is kept
    assert otel.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


@pytest.mark.parametrize(("api_type", "code", "status"), [
    ("rate_limit_error", None, 429), ("api_error", None, 500), ("invalid_request_error", None, 400),
    ("conflict_error", None, 409), ("rate_limit_error", "ramp_limit_exceeded", 429), ("some_future_error", None, 200),
])
def test_error_events_mid_stream_are_named_as_the_sdk_names_that_status(otel: Captured, api_type: str,
                                                                        code: str | None, status: int) -> None:
    body = wa.error_body(api_type, "failed")
    if code is not None:
        body["error"]["details"] = {"error_code": code}
    events = [*wa.sse(wa.text_events(TOKENS, usage=USAGE))[:5], wire.sse(body, event="error")]
    with pytest.raises(anthropic.APIStatusError):
        create(False, [wire.Reply.stream(events)], **REQUEST, stream=True)
    # what the SDK raises for the same error as a response status (200: none, its base class)
    same_before_a_stream = type(anthropic._error_classes.make_status_error(
        "failed", body=body, response=httpx2.Response(status, request=httpx2.Request("POST", BASE_URL))))
    assert same_before_a_stream is not anthropic.APIStatusError or status == 200
    otel.assert_finished(same_before_a_stream.__name__)


def test_a_stream_failing_after_a_newer_response_leaves_that_responses_headroom(otel: Captured) -> None:
    older, newer = wa.ratelimit_headers(requests=(50, 40)), wa.ratelimit_headers(requests=(50, 10))
    failing = [*wa.sse(wa.text_events(TOKENS, usage=USAGE))[:5], wa.error_event("overloaded_error", "Overloaded")]
    client, _ = sync_client([wire.Reply.stream(failing, headers=older),
                             wa.json_reply(wa.message_body("x", usage=USAGE), headers=newer)])
    stream = client.messages.create(**REQUEST, stream=True)  # its headers: 40 left
    client.messages.create(**REQUEST)  # a later response: 10 left
    with pytest.raises(anthropic.APIStatusError):
        list(stream)  # fails last, its headers being older
    remaining = otel.point(sc.STABLE_NAMES.rate_limit_remaining.name, otel_llm__rate_limit__resource="requests")
    assert remaining.value == 10


def test_asyncio_cancellation_is_recorded_as_cancelled(otel: Captured) -> None:
    client, _ = async_client([text_stream(delays=[0, 0, 0, 0, 5.0])])

    async def consume() -> None:
        async for _ in await client.messages.create(**REQUEST, stream=True):
            pass

    cancel_midway(consume)
    otel.assert_finished(sc.ERROR_CANCELLED)
    assert otel.span().events == ()  # a cancellation is not an exception to report


def test_abandoned_stream_finishes_when_collected_at_its_last_activity(otel: Captured) -> None:
    client, _ = sync_client([text_stream(delays=[0, 0, 0, 0.02])])
    stream = client.messages.create(**REQUEST, stream=True)
    for _ in range(3):
        next(stream)  # up to the first token
    del stream
    gc.collect()
    otel.assert_abandoned_at_first_token()


def test_async_stream_exhausted_in_a_with_block(otel: Captured) -> None:
    client, _ = async_client([text_stream()])

    async def main() -> int:
        stream = await client.messages.create(**REQUEST, stream=True)
        assert isinstance(stream, anthropic.AsyncStream)
        async with stream as same:
            assert same is stream
            count = len([event async for event in stream])
        await stream.close()
        return count

    assert asyncio.run(main()) == 8
    otel.assert_finished(None)


def test_async_break_then_close(otel: Captured) -> None:
    client, _ = async_client([text_stream()])

    async def main() -> None:
        stream = await client.messages.create(**REQUEST, stream=True)
        async for _ in stream:
            break
        await stream.close()

    asyncio.run(main())
    otel.assert_finished(sc.ERROR_CANCELLED)


# --- the messages.stream() helper -----------------------------------------------------------------------------------


def use_helper(client: anthropic.Anthropic) -> dict[str, Any]:
    """Everything the helper offers, as an application reads it."""
    with client.messages.stream(**REQUEST) as stream:
        events = [event.model_dump_json(exclude_unset=True) for event in stream]
        final = stream.get_final_message()
        return {"events": events, "final": final.model_dump_json(exclude_unset=True), "text": stream.get_final_text(),
                "request_id": stream.request_id}


def test_stream_helper_is_exactly_as_without_us(instrument: Instrument) -> None:
    without = use_helper(sync_client([text_stream()])[0])
    otel = instrument()
    client, _ = sync_client([text_stream(delays=[0, 0, 0, 0.02])])
    assert use_helper(client) == without
    assert without["text"] == "Hello world" and without["request_id"] == wa.REQUEST_ID
    otel.assert_finished(None)
    attrs = attributes(otel.span())
    assert attrs[sc.REQUEST_STREAM] is True and attrs[sc.PROMPT_LENGTH] == PROMPT_CHARS
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] >= 0.02
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 3 and attrs[sc.CONTENT_CHUNKS] == 3


def test_stream_helper_text_stream_and_final_text(otel: Captured) -> None:
    client, _ = sync_client([text_stream()])
    manager = client.messages.stream(**REQUEST)
    assert otel.spans() == [] and not otel.metrics()  # nothing is sent before the manager is entered
    with manager as stream:
        assert list(stream.text_stream) == TOKENS
        assert stream.get_final_text() == "Hello world"
        assert stream.get_final_message().usage.output_tokens == 3
    otel.assert_finished(None)


def test_stream_helper_early_exit_finishes_at_the_with_exit(otel: Captured) -> None:
    client, _ = sync_client([text_stream()])
    with client.messages.stream(**REQUEST) as stream:
        for event in stream:
            if event.type == "text":
                break
        assert otel.spans() == []
    otel.assert_finished(sc.ERROR_CANCELLED)
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 1


def test_stream_helper_error_event_reaches_get_final_message(otel: Captured) -> None:
    events = [*wa.sse(wa.text_events(TOKENS, usage=USAGE))[:4], wa.error_event("api_error", "Internal error")]
    client, _ = sync_client([wire.Reply.stream(events)])
    with client.messages.stream(**REQUEST) as stream, pytest.raises(anthropic.APIStatusError, match="api_error"):
        stream.get_final_message()
    otel.assert_finished("InternalServerError")  # an api_error event: what a 500 is recorded as


def test_stream_helper_refused_request_fails_the_with(otel: Captured) -> None:
    client, _ = sync_client([wa.rate_limited(0.01)])
    with pytest.raises(anthropic.RateLimitError), client.messages.stream(**REQUEST):
        pass
    otel.assert_finished("RateLimitError")
    assert attributes(otel.span())[sc.RETRY_AFTER] == 0.01


def test_async_stream_helper(otel: Captured) -> None:
    client, _ = async_client([text_stream()])

    async def main() -> tuple[list[str], str]:
        async with client.messages.stream(**REQUEST) as stream:
            texts = [text async for text in stream.text_stream]
            return texts, await stream.get_final_text()

    assert asyncio.run(main()) == (TOKENS, "Hello world")
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.USAGE_INPUT_TOKENS] == INPUT_TOKENS


def test_an_async_stream_helper_never_entered_warns_as_without_us(instrument: Instrument) -> None:
    """stream() built the request and nobody sent it: the program is told of the client's own coroutine never
    awaited, and of nothing of ours."""
    def warned() -> list[str]:
        client, _ = async_client([])

        async def build_and_drop() -> None:
            client.messages.stream(**REQUEST)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(build_and_drop())
            gc.collect()
        return sorted(str(warning.message) for warning in caught)

    without = warned()
    otel = instrument()
    assert warned() == without == ["coroutine 'AsyncAPIClient.post' was never awaited"]
    assert otel.spans() == []


def test_async_stream_helper_early_exit(otel: Captured) -> None:
    client, _ = async_client([text_stream()])

    async def main() -> None:
        async with client.messages.stream(**REQUEST) as stream:
            async for event in stream:
                if event.type == "text":
                    break

    asyncio.run(main())
    otel.assert_finished(sc.ERROR_CANCELLED)


# --- with_raw_response / with_streaming_response -----------------------------------------------------------------


def test_raw_response_plain_finishes_when_returned(otel: Captured) -> None:
    reply = wa.json_reply(wa.message_body("Hi", usage=USAGE), headers=wa.ratelimit_headers(**LIMITS))
    client, _ = sync_client([reply])
    raw = client.messages.with_raw_response.create(**REQUEST)
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "49"
    # the body was read before the call returned: so was the operation, whether or not parse() follows
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_INPUT_TOKENS] == INPUT_TOKENS
    assert attrs[sc.RATE_LIMIT_REMAINING_PREFIX + sc.RATE_LIMIT_INPUT_TOKENS] == 79_900
    assert raw.parse().content[0].text == "Hi"
    assert raw.parse() is raw.parse()
    assert len(otel.spans()) == 1


def test_async_raw_response_plain(otel: Captured) -> None:
    client, _ = async_client([wa.json_reply(wa.message_body("Hi", usage=USAGE))])

    async def main() -> str:
        raw = await client.messages.with_raw_response.create(**REQUEST)
        assert otel.spans() != []  # finished when returned, before the parse
        message = await raw.parse()
        return str(message.content[0].text)

    assert asyncio.run(main()) == "Hi"
    assert attributes(otel.span())[sc.RESPONSE_ID] == wa.MESSAGE_ID


def test_raw_response_stream_parse_gives_our_stream(otel: Captured) -> None:
    client, _ = sync_client([text_stream()])
    raw = client.messages.with_raw_response.create(**REQUEST, stream=True)
    stream = raw.parse()
    assert isinstance(stream, anthropic.Stream)
    assert raw.parse() is stream  # parse() hands out the same object every time, as the SDK does
    assert len(list(stream)) == 8
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == 3 and attrs[sc.USAGE_OUTPUT_TOKENS] == 3


def test_streaming_response_stream_parse_and_exit(otel: Captured) -> None:
    client, _ = sync_client([text_stream()])
    with client.messages.with_streaming_response.create(**REQUEST, stream=True) as response:
        assert response.status_code == 200
        assert len(list(response.parse())) == 8
    otel.assert_finished(None)
    assert otel.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


def test_streaming_response_read_raw_finishes_on_exit(otel: Captured) -> None:
    client, _ = sync_client([text_stream()])
    with client.messages.with_streaming_response.create(**REQUEST, stream=True) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == 'data: {"type":"message_stop"}'
    otel.assert_finished(None)


def test_raw_stream_read_by_the_caller_to_its_end_then_dropped_is_complete(otel: Captured) -> None:
    """with_raw_response's stream has no close(): the body's end, not the response being dropped, ends it."""
    client, _ = sync_client([text_stream(delays=[0, 0, 0, 0.1, 0.05, 0.05])])
    raw = client.messages.with_raw_response.create(**REQUEST, stream=True)
    lines = [line for line in raw.iter_lines() if line]
    assert lines[-1] == 'data: {"type":"message_stop"}'
    del raw
    gc.collect()
    otel.metrics()  # what a finalizer ended is written by the next collection
    otel.assert_finished(None)
    span = otel.span()
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 >= 0.15


def test_async_streaming_response_plain(otel: Captured) -> None:
    client, _ = async_client([wa.json_reply(wa.message_body("Hi", usage=USAGE))])

    async def main() -> str:
        async with client.messages.with_streaming_response.create(**REQUEST) as response:
            message = await response.parse()
        return str(message.content[0].text)

    assert asyncio.run(main()) == "Hi"
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.USAGE_OUTPUT_TOKENS] == 3


class Answer(pydantic.BaseModel):
    city: str


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_raw_structured_answer_the_parser_refuses_is_read_as_sent(otel: Captured, is_async: bool) -> None:
    """beta.messages.with_raw_response returns before the output_format parser runs: the call succeeded, and the span
    reads the message as the server sent it. The parser's refusal is the caller's to meet, when it parses."""
    cut = wa.json_reply(wa.message_body('{"city": "Par', usage=USAGE, stop_reason="max_tokens"))
    if is_async:
        client, _ = async_client([cut])
        raw = asyncio.run(client.beta.messages.with_raw_response.parse(**REQUEST, output_format=Answer))
    else:
        client, _ = sync_client([cut])
        raw = client.beta.messages.with_raw_response.parse(**REQUEST, output_format=Answer)
    otel.assert_finished(None)
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 3 and attrs[sc.RESPONSE_FINISH_REASONS] == ("max_tokens",)
    with pytest.raises(pydantic.ValidationError):
        raw.parse() if not is_async else asyncio.run(raw.parse())
    assert len(otel.spans()) == 1


@pytest.mark.parametrize("beta", [False, True], ids=["messages", "beta"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_stream_helper_refusing_a_structured_answer_cut_short_fails_the_call(otel: Captured, beta: bool,
                                                                                is_async: bool) -> None:
    """The stream() helper parses each text block as it ends, and raises on an answer cut at max_tokens after our
    stream handed the event over: the operation fails with the caller's error, not as a stream the caller stopped."""
    events = wa.text_events(['{"city": ', '"Par'], usage=USAGE, stop_reason="max_tokens")
    cut = wa.stream_reply(events)

    def helper(client: Any) -> Any:
        return (client.beta.messages if beta else client.messages).stream(**REQUEST, output_format=Answer)

    if is_async:
        async def read() -> None:
            async with helper(async_client([cut])[0]) as stream:
                async for _ in stream:
                    pass

        with pytest.raises(pydantic.ValidationError):
            asyncio.run(read())
    else:
        with pytest.raises(pydantic.ValidationError), helper(sync_client([cut])[0]) as stream:
            for _ in stream:
                pass
    otel.assert_finished("ValidationError")
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 2


def test_structured_output_is_a_json_output_type(otel: Captured) -> None:
    client, _ = sync_client([wa.json_reply(wa.message_body('{"city": "Paris"}', usage=USAGE))] * 2)
    client.messages.create(**REQUEST, output_config={"format": {"type": "json_schema",
                                                                "schema": Answer.model_json_schema()}})
    client.beta.messages.parse(**REQUEST, output_format=Answer)
    assert [attributes(span).get(sc.OUTPUT_TYPE) for span in otel.spans()] == ["json", "json"]


def test_messages_parse_is_an_operation(otel: Captured) -> None:
    client, _ = sync_client([wa.json_reply(wa.message_body('{"answer": 42}', usage=USAGE))])
    parsed = client.messages.parse(**REQUEST)
    assert parsed.content[0].text == '{"answer": 42}'  # type: ignore[union-attr]
    assert attributes(otel.span())[sc.USAGE_OUTPUT_TOKENS] == 3


@pytest.mark.parametrize("answer, stop_reason", [('{"town": "Paris"}', "end_turn"), ('{"city": "Par', "max_tokens")],
                         ids=["not in the format", "cut short"])
@pytest.mark.parametrize("beta", [False, True], ids=["messages", "beta"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_structured_answer_the_parser_refuses_fails_the_call_and_keeps_its_usage(
        otel: Captured, answer: str, stop_reason: str, beta: bool, is_async: bool) -> None:
    """parse() raises pydantic's ValidationError on an answer not in the format asked for, or cut short, and that
    error carries no message. The tokens were billed all the same: the message is read as the parser is handed it."""
    reply = wa.json_reply(wa.message_body(answer, usage=USAGE, stop_reason=stop_reason))
    with pytest.raises(pydantic.ValidationError):
        if is_async:
            aclient, _ = async_client([reply])
            asyncio.run((aclient.beta.messages if beta else aclient.messages).parse(**REQUEST, output_format=Answer))
        else:
            client, _ = sync_client([reply])
            (client.beta.messages if beta else client.messages).parse(**REQUEST, output_format=Answer)
    otel.assert_finished("ValidationError")
    attrs = attributes(otel.span())
    assert attrs[sc.RESPONSE_ID] == wa.MESSAGE_ID and attrs[sc.RESPONSE_FINISH_REASONS] == (stop_reason,)
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS]) == (INPUT_TOKENS, USAGE.output)


# --- beta.messages: the same operations, Beta-named shapes ---------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_beta_messages_create_is_an_operation_like_messages(otel: Captured, is_async: bool, stream: bool) -> None:
    plain = wa.json_reply(wa.message_body("Hello world", usage=USAGE))
    reply = text_stream(delays=[0, 0, 0, 0.02]) if stream else plain
    request = {**REQUEST, "betas": ["context-management-2025-06-27"]}
    if is_async:
        client, recorder = async_client([reply])

        async def go() -> Any:
            result = await client.beta.messages.create(**request, stream=stream)  # type: ignore[call-overload]
            return [event async for event in result] if stream else result

        result = asyncio.run(go())
    else:
        sync, recorder = sync_client([reply])
        result = sync.beta.messages.create(**request, stream=stream)  # type: ignore[call-overload]
        result = list(result) if stream else result

    assert recorder.requests[0].path == "/v1/messages"
    assert recorder.requests[0].headers["anthropic-beta"] == "context-management-2025-06-27"  # sent as it was
    attrs = dict(attributes(otel.span()))
    assert {key: attrs[key] for key in RESPONSE_ATTRIBUTES} == RESPONSE_ATTRIBUTES
    assert attrs[sc.REQUEST_STREAM] is stream and attrs[sc.PROMPT_LENGTH] == PROMPT_CHARS
    if stream:
        assert [event.type for event in result].count("content_block_delta") == 3
        assert attrs[sc.CONTENT_CHUNKS] == 3 and attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] >= 0.02
        assert otel.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1
    else:
        assert result.content[0].text == "Hello world"
    otel.assert_finished(None)


def test_beta_stream_helper_is_exactly_as_without_us(instrument: Instrument) -> None:
    def use(client: anthropic.Anthropic) -> tuple[list[str], str, int]:
        with client.beta.messages.stream(**REQUEST) as stream:
            texts = list(stream.text_stream)
            return texts, stream.get_final_text(), stream.get_final_message().usage.output_tokens

    without = use(sync_client([text_stream()])[0])
    otel = instrument()
    assert use(sync_client([text_stream()])[0]) == without == (TOKENS, "Hello world", 3)
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 3


def test_async_beta_stream_helper(otel: Captured) -> None:
    client, _ = async_client([text_stream()])

    async def main() -> list[str]:
        async with client.beta.messages.stream(**REQUEST) as stream:
            return [text async for text in stream.text_stream]

    assert asyncio.run(main()) == TOKENS
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.USAGE_INPUT_TOKENS] == INPUT_TOKENS


def test_beta_messages_parse_is_an_operation(otel: Captured) -> None:
    client, _ = sync_client([wa.json_reply(wa.message_body('{"answer": 42}', usage=USAGE))])
    parsed = client.beta.messages.parse(**REQUEST)
    assert parsed.content[0].text == '{"answer": 42}'  # type: ignore[union-attr]
    assert attributes(otel.span())[sc.USAGE_OUTPUT_TOKENS] == 3


# --- errors and retries ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("retries", [0, 2])
def test_rate_limited_with_retries_counted_and_headroom_recorded(otel: Captured, retries: int) -> None:
    client, recorder = sync_client([wa.rate_limited(0.01)] * (retries + 1), max_retries=retries)
    with pytest.raises(anthropic.RateLimitError) as raised:
        client.messages.create(**REQUEST)
    assert raised.value.status_code == 429 and raised.value.__cause__ is None
    assert len(recorder.requests) == retries + 1
    span = otel.span()  # one span for the operation, retries inside it
    attrs = attributes(span)
    assert span.status.status_code is StatusCode.ERROR
    assert attrs[sc.ERROR_TYPE] == "RateLimitError" and "RateLimitError" in sc.RATE_LIMIT_ERROR_TYPES
    assert attrs.get(sc.RETRIES) == (retries or None)
    assert attrs[sc.RETRY_AFTER] == 0.01
    assert attrs[sc.RATE_LIMIT_REMAINING_PREFIX + sc.RATE_LIMIT_REQUESTS] == 0
    assert attrs[sc.RATE_LIMIT_LIMIT_PREFIX + sc.RATE_LIMIT_OUTPUT_TOKENS] == 10_000
    assert otel.point(sc.STABLE_NAMES.duration.name).attributes[sc.ERROR_TYPE] == "RateLimitError"
    assert otel.point(sc.STABLE_NAMES.rate_limit_remaining.name,
                      otel_llm__rate_limit__resource="requests").value == 0


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_overloaded_is_retried_then_recorded_by_class(otel: Captured, is_async: bool) -> None:
    replies = [wa.overloaded(), wa.overloaded()]
    if is_async:
        client, recorder = async_client(replies, max_retries=1)
        with pytest.raises(anthropic.OverloadedError):
            asyncio.run(client.messages.create(**REQUEST, stream=True))
    else:
        sync, recorder = sync_client(replies, max_retries=1)
        with pytest.raises(anthropic.OverloadedError):
            sync.messages.create(**REQUEST, stream=True)
    assert len(recorder.requests) == 2
    otel.assert_finished("OverloadedError")
    assert attributes(otel.span())[sc.RETRIES] == 1
    assert otel.metrics().get(sc.STABLE_NAMES.time_to_first_chunk.name) is None


def test_retry_then_success_is_one_ok_span(otel: Captured) -> None:
    client, recorder = sync_client([wa.overloaded(), wa.rate_limited(0.01), text_stream()], max_retries=2)
    assert len(list(client.messages.create(**REQUEST, stream=True))) == 8
    assert len(recorder.requests) == 3
    attrs = attributes(otel.span())
    assert attrs[sc.RETRIES] == 2
    assert sc.ERROR_TYPE not in attrs
    # the stream's own response had no rate-limit headers: the 429's headroom is what is known
    assert attrs[sc.RATE_LIMIT_REMAINING_PREFIX + sc.RATE_LIMIT_REQUESTS] == 0


# --- the SDK's own span ------------------------------------------------------------------------------------------


def traceparent_of(span: Any) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-"


def test_without_us_the_sdk_opens_its_own_client_span() -> None:
    """What the SDK does by itself, which the tests below rely on."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client, recorder = sync_client([text_stream()], open_telemetry={"tracer_provider": provider})
    list(client.messages.create(**REQUEST, stream=True))
    (span,) = exporter.get_finished_spans()
    assert span.name == "anthropic.messages.create" and span.kind is SpanKind.CLIENT
    assert span.instrumentation_scope is not None and span.instrumentation_scope.name == "com.anthropic.sdk.python"
    assert attributes(span)[sc.OPERATION_NAME] == sc.OP_CHAT
    assert recorder.requests[0].headers["traceparent"].startswith(traceparent_of(span))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_with_the_sdks_tracing_on_there_is_one_span_ours(otel: Captured, is_async: bool, stream: bool) -> None:
    reply = text_stream() if stream else wa.json_reply(wa.message_body("Hi", usage=USAGE))
    sdk_tracing = {"open_telemetry": {"tracer_provider": otel.tracer_provider}}  # the SDK's spans would land here
    if is_async:
        client, recorder = async_client([reply], **sdk_tracing)

        async def main() -> None:
            result = await client.messages.create(**REQUEST, stream=stream)
            if stream:
                _ = [event async for event in result]  # type: ignore[union-attr]

        asyncio.run(main())
    else:
        sync, recorder = sync_client([reply], **sdk_tracing)
        result = sync.messages.create(**REQUEST, stream=stream)
        if stream:
            list(result)

    span = otel.span()  # no anthropic.messages.create beside it
    assert span.name == f"chat {MODEL}" and span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == sc.INSTRUMENTATION_SCOPE
    assert attributes(span)[sc.USAGE_OUTPUT_TOKENS] == 3
    # the SDK still propagates the trace context, and it names our span
    assert recorder.requests[0].headers["traceparent"].startswith(traceparent_of(span))
    (duration,) = otel.metrics()[sc.STABLE_NAMES.duration.name]
    assert [(e.trace_id, e.span_id) for e in duration.exemplars] == [(span.context.trace_id, span.context.span_id)]


def test_with_the_sdks_tracing_off_nothing_is_propagated(otel: Captured) -> None:
    client, recorder = sync_client([text_stream()], open_telemetry=False)
    list(client.messages.create(**REQUEST, stream=True))
    assert otel.span().name == f"chat {MODEL}"
    assert "traceparent" not in recorder.requests[0].headers


def test_calls_we_do_not_instrument_keep_the_sdks_span(otel: Captured) -> None:
    client, _ = sync_client([wa.json_reply({"input_tokens": 14})],
                            open_telemetry={"tracer_provider": otel.tracer_provider})
    assert client.messages.count_tokens(model=MODEL, messages=MESSAGES).input_tokens == 14  # type: ignore[arg-type]
    assert otel.span().name == "anthropic.messages.count_tokens"


# --- Bedrock and Vertex ------------------------------------------------------------------------------------------

BEDROCK_MODEL = "us.anthropic.claude-haiku-4-5-20251001-v1:0"  # an inference-profile id
VERTEX_MODEL = "claude-haiku-4-5@20251001"


def platform_client(platform: str, reply: wire.Reply, is_async: bool) -> tuple[Any, wire.Recorder]:
    http, recorder = wire.mock_client([reply], async_=is_async)  # type: ignore[call-overload]
    if platform == "bedrock":
        cls: Any = anthropic.AsyncAnthropicBedrock if is_async else anthropic.AnthropicBedrock
        # dummy credentials: the SDK signs each request with SigV4 for real
        return cls(aws_access_key="AKIDEXAMPLE", aws_secret_key="wJalrXUtnFEMI/K7MDENG", aws_region="us-east-1",
                   http_client=http, max_retries=0), recorder
    cls = anthropic.AsyncAnthropicVertex if is_async else anthropic.AnthropicVertex
    return cls(region="us-east5", project_id="my-project", access_token="ya29.test-token", http_client=http,
               max_retries=0), recorder


def test_a_client_that_learns_its_url_on_its_first_request_records_the_server_it_reached(
        otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    """AnthropicGoogleCloud on Application Default Credentials derives its URL from the project those name, on its
    first request: until then it has none, and the server is the one the response came from, not an invented one."""
    class Credentials:
        token, expired = "ya29.adc-token", False

        def refresh(self, request: object) -> None:
            pass

    # the machine's default credentials, as google-auth would find them (it is not installed here)
    modules = {name: types.ModuleType(name) for name in (
        "google", "google.auth", "google.auth.transport", "google.auth.transport.requests")}
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
        monkeypatch.setitem(sys.modules, name, module)
    modules["google.auth"].default = lambda scopes=None: (Credentials(), "my-project")  # type: ignore[attr-defined]
    modules["google.auth.transport.requests"].Request = lambda: None  # type: ignore[attr-defined]
    http, recorder = wire.mock_client([wa.json_reply(wa.message_body("Hi", usage=USAGE))] * 2)
    client = anthropic.AnthropicGoogleCloud(workspace_id="wrkspc_1", http_client=http, max_retries=0)
    for _ in range(2):
        client.messages.create(**REQUEST)
    assert {request.headers["host"] for request in recorder.requests} == {"claude.googleapis.com"}
    assert [(attributes(span)[sc.SERVER_ADDRESS], attributes(span)[sc.SERVER_PORT])
            for span in otel.spans()] == [("claude.googleapis.com", 443)] * 2
    assert {(point.attributes[sc.SERVER_ADDRESS], point.attributes[sc.SERVER_PORT])
            for point in otel.metrics()[sc.STABLE_NAMES.duration.name]} == {("claude.googleapis.com", 443)}


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(("platform", "provider", "address", "model", "path"), [
    ("bedrock", sc.PROVIDER_AWS_BEDROCK, "bedrock-runtime.us-east-1.amazonaws.com", BEDROCK_MODEL,
     f"/model/{BEDROCK_MODEL}/invoke"),
    ("vertex", sc.PROVIDER_GCP_VERTEX_AI, "us-east5-aiplatform.googleapis.com", VERTEX_MODEL,
     f"/v1/projects/my-project/locations/us-east5/publishers/anthropic/models/{VERTEX_MODEL}:rawPredict"),
], ids=["bedrock", "vertex"])
@pytest.mark.parametrize("beta", [False, True], ids=["messages", "beta.messages"])
def test_platform_clients(otel: Captured, platform: str, provider: str, address: str, model: str, path: str,
                          stream: bool, is_async: bool, beta: bool) -> None:
    events = wa.text_events(TOKENS, usage=USAGE, model=model)
    if not stream:
        reply = wa.json_reply(wa.message_body("Hello world", usage=USAGE, model=model))
    elif platform == "bedrock":  # AWS event-stream frames, not SSE
        reply = wire.Reply.stream(wa.event_stream(events),
                                  headers={"content-type": "application/vnd.amazon.eventstream"})
    else:
        reply = wa.stream_reply(events)
    client, recorder = platform_client(platform, reply, is_async)
    messages = client.beta.messages if beta else client.messages  # the platforms' beta resources copy its methods
    request = {**REQUEST, "model": model, "stream": stream}

    async def run_async() -> Any:
        result = await messages.create(**request)
        return [event async for event in result] if stream else result

    result = asyncio.run(run_async()) if is_async else messages.create(**request)
    if stream:
        assert [event.type for event in result][2:5] == ["content_block_delta"] * 3
    else:
        assert result.content[0].text == "Hello world"

    streamed_path = path.replace("/invoke", "/invoke-with-response-stream").replace(":rawPredict", ":streamRawPredict")
    assert recorder.requests[0].path == (streamed_path if stream else path)
    attrs = dict(attributes(otel.span()))
    assert {key: attrs[key] for key in (sc.PROVIDER_NAME, sc.SERVER_ADDRESS, sc.SERVER_PORT, sc.REQUEST_MODEL,
                                        sc.RESPONSE_MODEL)} == {
        sc.PROVIDER_NAME: provider, sc.SERVER_ADDRESS: address, sc.SERVER_PORT: 443, sc.REQUEST_MODEL: model,
        sc.RESPONSE_MODEL: model}
    assert attrs[sc.USAGE_INPUT_TOKENS] == INPUT_TOKENS and attrs[sc.USAGE_OUTPUT_TOKENS] == 3
    if stream:
        assert attrs[sc.CONTENT_CHUNKS] == 3 and sc.RESPONSE_TIME_TO_FIRST_CHUNK in attrs
    else:
        assert sc.CONTENT_CHUNKS not in attrs and sc.RESPONSE_TIME_TO_FIRST_CHUNK not in attrs
    assert otel.point(sc.STABLE_NAMES.duration.name).attributes[sc.PROVIDER_NAME] == provider
    recorded = json.dumps(dict(attrs), default=str)
    assert "AKIDEXAMPLE" not in recorded and "ya29" not in recorded


def test_bedrock_exception_frame_mid_stream_is_named_as_boto3_names_it(otel: Captured) -> None:
    frames = [*wa.event_stream(wa.text_events(TOKENS, usage=USAGE, model=BEDROCK_MODEL))[:3],
              wb.exception("throttlingException", "Too many requests, please wait before trying again.")]
    reply = wire.Reply.stream(frames, headers={"content-type": "application/vnd.amazon.eventstream"})
    client, _ = platform_client("bedrock", reply, is_async=False)
    with pytest.raises(anthropic.APIStatusError, match="throttlingException"):
        list(client.messages.create(**{**REQUEST, "model": BEDROCK_MODEL}, stream=True))
    otel.assert_finished("ThrottlingException")  # as the boto3 path and the rate-limit rules name it


# --- timing agrees with what the caller saw, over a real socket ------------------------------------------------------

HEADERS_DELAY = 0.08
# message_start, content_block_start and ping come first; then five deltas at gaps well inside their buckets; the
# rest 20 ms after the last delta (a duration that ended at the last token would be 20 ms short)
LOOPBACK_TOKENS = ["one", " two", " three", " four", " five"]
LOOPBACK_DELAYS = [0.02, 0.005, 0.005, 0.03, 0.0225, 0.045, 0.072, 0.0285, 0.02]
Observation = tuple[int, list[tuple[int, bool]], int]  # issued, (arrival, is a text delta) per event, ended


def loopback_reply(request: wire.RecordedRequest) -> wire.Reply:
    events = wa.text_events(LOOPBACK_TOKENS, usage=wa.Usage(input=20, output=5))
    return wa.stream_reply(events, headers_delay=HEADERS_DELAY, delays=LOOPBACK_DELAYS)


def observe_sync(base_url: str) -> list[Observation]:
    client = anthropic.Anthropic(api_key=API_KEY, base_url=base_url, max_retries=0)

    def one() -> Observation:
        issued = time.perf_counter_ns()
        arrivals = [(time.perf_counter_ns(), event.type == "content_block_delta")
                    for event in client.messages.create(**REQUEST, stream=True)]
        return issued, arrivals, time.perf_counter_ns()

    return [one(), one()]  # the first warms the connection and the SDK's aggregations


def observe_async(base_url: str) -> list[Observation]:
    async def one(client: anthropic.AsyncAnthropic) -> Observation:
        issued = time.perf_counter_ns()
        arrivals = [(time.perf_counter_ns(), event.type == "content_block_delta")
                    async for event in await client.messages.create(**REQUEST, stream=True)]
        return issued, arrivals, time.perf_counter_ns()

    async def main() -> list[Observation]:
        client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=base_url, max_retries=0)
        return [await one(client), await one(client)]

    return asyncio.run(main())


@pytest.mark.usefixtures("steady_clock")
@pytest.mark.parametrize("observe", [observe_sync, observe_async], ids=["sync", "async"])
def test_ttft_gaps_and_duration_match_the_callers_observation(otel: Captured, observe: Any) -> None:
    with wire.LoopbackServer(loopback_reply) as server:
        _, (issued, arrivals, ended) = observe(server.base_url.removesuffix("/v1"))

    content = [at for at, is_delta in arrivals if is_delta]
    observed_ttft = (content[0] - issued) / 1e9
    observed_gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(content)]
    assert observed_ttft >= HEADERS_DELAY + sum(LOOPBACK_DELAYS[:4])  # message_start and ping did not count

    second = otel.spans()[-1]
    attrs = attributes(second)
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] == pytest.approx(observed_ttft, abs=1 * MS)
    assert attrs[sc.MAX_CHUNK_GAP] == pytest.approx(max(observed_gaps), abs=1 * MS)
    assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(sum(observed_gaps) / 4, abs=1 * MS)
    assert second.end_time is not None and second.start_time is not None
    # the duration is TTFT and the tail after the first token, each within 1 ms of the caller's view of it
    recorded_duration = (second.end_time - second.start_time) / 1e9
    recorded_tail = recorded_duration - attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK]
    assert recorded_tail == pytest.approx((ended - content[0]) / 1e9, abs=1 * MS)
    assert recorded_duration <= (ended - issued) / 1e9
    first_ttft = attributes(otel.spans()[0])[sc.RESPONSE_TIME_TO_FIRST_CHUNK]
    ttfc = otel.point(sc.STABLE_NAMES.time_to_first_chunk.name)
    assert ttfc.count == 2 and ttfc.sum - first_ttft == pytest.approx(observed_ttft, abs=1 * MS)


# --- content, and the patch table ----------------------------------------------------------------------------------


def test_content_only_when_opted_in(instrument: Instrument) -> None:
    captured = instrument(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY")
    client, _ = sync_client([text_stream()])
    list(client.messages.create(**REQUEST, stream=True))
    attrs = attributes(captured.span())
    assert json.loads(attrs[sc.SYSTEM_INSTRUCTIONS]) == [{"type": "text", "content": SYSTEM}]
    assert json.loads(attrs[sc.INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Say hello"}]}]
    assert json.loads(attrs[sc.OUTPUT_MESSAGES]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Hello world"}], "finish_reason": "end_turn"}]
    assert API_KEY not in json.dumps(dict(attrs))


def test_no_content_and_no_secrets_by_default(otel: Captured) -> None:
    client, _ = sync_client([text_stream()])
    list(client.messages.create(**REQUEST, stream=True))
    recorded = json.dumps({**attributes(otel.span())}, default=str)
    recorded += json.dumps([dict(p.attributes) for points in otel.metrics().values() for p in points])
    assert "Say hello" not in recorded and "Hello world" not in recorded
    assert API_KEY not in recorded and "x-api-key" not in recorded.lower()


def test_the_clients_key_quoted_by_an_error_of_the_callers_own_is_not_recorded(otel: Captured) -> None:
    http, _ = wire.mock_client([text_stream()])

    def refuse(request: Any) -> None:
        raise RuntimeError(f"policy refused a request with headers {dict(request.headers)}")

    http.event_hooks["request"] = [refuse]
    client = anthropic.Anthropic(api_key=API_KEY, base_url=BASE_URL, http_client=http, max_retries=0)
    with pytest.raises(anthropic.APIConnectionError) as raised:  # anthropic wraps what is not an HTTP error
        client.messages.create(**REQUEST)
    assert API_KEY in str(raised.value.__cause__)
    assert "[REDACTED]" in otel.span().to_json() and API_KEY not in otel.span().to_json()


@pytest.mark.timing  # TPOT from pauses of 10-20 ms, within 4 ms
def test_time_per_output_token_leaves_out_a_server_tools_wait(otel: Captured) -> None:
    """The web search runs on the service: 300 ms with no decoding between the text before it and after."""
    events = wa.message_events([("text", list("abc")), ("text", list("def"))], usage=wa.Usage(input=9, output=7))
    second_text = next(i for i, (name, data) in enumerate(events)
                       if name == "content_block_start" and data["index"] == 1)
    search = [("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
                  "type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}}),
              ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                       "delta": {"type": "input_json_delta", "partial_json": '{"query":"q"}'}}),
              ("content_block_stop", {"type": "content_block_stop", "index": 1}),
              ("content_block_start", {"type": "content_block_start", "index": 2, "content_block": {
                  "type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}}),
              ("content_block_stop", {"type": "content_block_stop", "index": 2})]
    for _, data in events[second_text:]:  # the answer's second text block comes after the search's two
        if data.get("index") == 1:
            data["index"] = 3
    events[second_text:second_text] = search
    deltas = [i for i, (name, _) in enumerate(events) if name == "content_block_delta"]
    delays = [0.0] * len(events)
    for i in deltas[1:]:
        delays[i] = 0.02
    delays[deltas[4]] = 0.3  # the first text after the search result
    client, _ = sync_client([wa.stream_reply(events, delays=delays)])
    list(client.messages.create(**REQUEST, stream=True))
    attrs = attributes(otel.span())
    assert attrs[sc.MAX_CHUNK_GAP] >= 0.3  # the wait is seen where it happened
    # 7 output tokens over 5 gaps of 20 ms: the search is not decoding
    assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(0.02 * 5 / 6, abs=0.004)


def test_a_key_the_server_quotes_in_its_error_is_not_recorded(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.json(wa.error_body("authentication_error", f"invalid x-api-key {API_KEY}"),
                                             status=401)])
    with pytest.raises(anthropic.AuthenticationError, match=API_KEY):
        client.messages.create(**REQUEST)
    (event,) = otel.span().events
    assert event.attributes is not None and "invalid x-api-key [REDACTED]" in str(event.attributes["exception.message"])
    assert API_KEY not in otel.span().to_json()


def test_uninstrument_restores_every_target_exactly(instrument: Instrument) -> None:
    originals = {target: vars(owner(target))[target.attribute.rsplit(".", 1)[-1]]
                 for target in anthropic_adapter.PROVIDER.targets}
    captured = instrument()
    for target in originals:
        assert isinstance(vars(owner(target))[target.attribute.rsplit(".", 1)[-1]], wrapt.FunctionWrapper), target
    otel_llm.uninstrument()
    for target, original in originals.items():
        assert vars(owner(target))[target.attribute.rsplit(".", 1)[-1]] is original, target
    client, _ = sync_client([text_stream()])
    list(client.messages.create(**REQUEST, stream=True))
    assert captured.spans() == []


def owner(target: Any) -> Any:
    found = __import__(target.module, fromlist=["_"])
    for part in target.attribute.split(".")[:-1]:
        found = getattr(found, part)
    return found
