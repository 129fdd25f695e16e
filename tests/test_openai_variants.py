"""The other call shapes of the openai client: raw and streaming responses, the Responses API, legacy completions,
embeddings, and the servers a client can point at (OpenAI-compatible, Azure)."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import httpx2
import openai
import pydantic
import pytest
import wire
from conftest import API_KEY, Captured, async_client, attributes, openai_server, sync_client
from openai.types.chat import ChatCompletionChunk
from opentelemetry import trace

from otel_llm import _semconv as sc

TOKENS = ["x", "y", "z"]
USAGE = wire.Usage(input=9, output=3, cached=2)
MESSAGES = [{"role": "user", "content": "hello"}]


# --- with_raw_response / with_streaming_response -----------------------------------------------------------------


def test_raw_response_plain(otel: Captured) -> None:
    headers = wire.openai_ratelimit_headers(500, 499, 30_000, 29_000)
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("xyz", usage=USAGE), headers=headers)])
    raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert raw.headers["x-ratelimit-remaining-requests"] == "499"
    completion = raw.parse()
    assert completion.choices[0].message.content == "xyz"
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_INPUT_TOKENS] == 9
    assert attrs[sc.RATE_LIMIT_REMAINING_PREFIX + sc.RATE_LIMIT_REQUESTS] == 499
    assert attrs[sc.RATE_LIMIT_LIMIT_PREFIX + sc.RATE_LIMIT_TOKENS] == 30_000
    remaining = otel.point(sc.STABLE_NAMES.rate_limit_remaining.name, otel_llm__rate_limit__resource="tokens")
    assert remaining.value == 29_000


def test_raw_response_stream_parse_gives_our_stream(otel: Captured) -> None:
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, stream=True,
                                                            stream_options={"include_usage": True})
    assert not hasattr(raw, "close")  # the client's raw response has none: nor has ours
    assert repr(raw).startswith("<APIResponse [200 OK] type=")  # the client's own repr
    stream = raw.parse()
    assert isinstance(stream, openai.Stream)
    assert raw.parse() is stream  # parse() hands out the same object every time, as the SDK does
    assert [c.choices[0].delta.content if c.choices else "usage" for c in stream] == ["", "x", "y", "z", None,
                                                                                    "usage"]
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == 3
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 3


class Answer(pydantic.BaseModel):
    city: str


CUT_ANSWER = '{"city": "Par'  # structured output the length limit cut off: the client's parser refuses it


def _cut_reply(endpoint: str) -> wire.Reply:
    if endpoint == "chat":
        return wire.Reply.json(wire.chat_completion_body(CUT_ANSWER, usage=USAGE, finish_reason="length"))
    return wire.Reply.json(wire.response_body(CUT_ANSWER, usage=USAGE))


def _parse_raw(client: Any, endpoint: str) -> Any:
    if endpoint == "chat":
        return client.chat.completions.with_raw_response.parse(model="m", messages=MESSAGES, response_format=Answer)
    return client.responses.with_raw_response.parse(model="m", input="hello", text_format=Answer)


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_raw_structured_answer_the_parser_refuses_is_read_as_sent(otel: Captured, endpoint: str,
                                                                     is_async: bool) -> None:
    """with_raw_response returns before the client's structured-output parser runs: the call succeeded, and the
    span reads the answer as the server sent it. The parser's refusal is the caller's to meet, when it parses."""
    if is_async:
        client, _ = async_client([_cut_reply(endpoint)])
        raw = asyncio.run(_parse_raw(client, endpoint))
    else:
        client, _ = sync_client([_cut_reply(endpoint)])
        raw = _parse_raw(client, endpoint)
    otel.assert_finished(None)
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 3 and attrs[sc.USAGE_INPUT_TOKENS] == 9
    assert attrs[sc.RESPONSE_ID] == ("chatcmpl-abc" if endpoint == "chat" else "resp_abc")
    if endpoint == "chat":
        assert attrs[sc.RESPONSE_FINISH_REASONS] == ("length",)
    refused = openai.LengthFinishReasonError if endpoint == "chat" else pydantic.ValidationError
    with pytest.raises(refused):
        raw.parse()
    assert len(otel.spans()) == 1


def test_a_structured_answer_cut_at_the_length_limit_fails_the_call_and_keeps_its_usage(otel: Captured) -> None:
    """The client raises from parse() itself: that is the call's error, and the completion it carries is read."""
    client, _ = sync_client([_cut_reply("chat")])
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model="m", messages=MESSAGES, response_format=Answer)
    otel.assert_finished("LengthFinishReasonError")
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 3
    assert attrs[sc.RESPONSE_FINISH_REASONS] == ("length",)
    assert attrs[sc.RESPONSE_ID] == "chatcmpl-abc"


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_structured_answer_that_does_not_fit_its_format_fails_the_call_and_keeps_its_usage(
        otel: Captured, is_async: bool) -> None:
    """A whole answer that is not the format asked for (a compatible server that does not hold to the schema):
    chat.completions.parse() raises pydantic's ValidationError, which carries no completion. The tokens were billed
    all the same: the completion is read as the parser is handed it."""
    reply = wire.Reply.json(wire.chat_completion_body('{"town": "Paris"}', usage=USAGE))
    kwargs = {"model": "m", "messages": MESSAGES, "response_format": Answer}
    with pytest.raises(pydantic.ValidationError):
        if is_async:
            aclient, _ = async_client([reply])
            asyncio.run(aclient.chat.completions.parse(**kwargs))  # type: ignore[arg-type]
        else:
            client, _ = sync_client([reply])
            client.chat.completions.parse(**kwargs)  # type: ignore[arg-type]
    otel.assert_finished("ValidationError")
    attrs = attributes(otel.span())
    assert attrs[sc.RESPONSE_ID] == "chatcmpl-abc" and attrs[sc.RESPONSE_FINISH_REASONS] == ("stop",)
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS]) == (9, 3)
    usage = otel.point(sc.STABLE_NAMES.token_usage.name, gen_ai__token__type="output")  # type: ignore[union-attr]
    assert (usage.count, usage.sum) == (1, 3)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_responses_structured_answer_cut_short_fails_the_call_and_keeps_its_usage(otel: Captured,
                                                                                     is_async: bool) -> None:
    """responses.parse() refuses an answer cut at max_output_tokens with pydantic's ValidationError, which carries no
    response: the response is read as the parser is handed it."""
    body = wire.response_body(CUT_ANSWER, usage=USAGE)
    body.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    kwargs = {"model": "m", "input": "hello", "text_format": Answer}
    with pytest.raises(pydantic.ValidationError):
        if is_async:
            aclient, _ = async_client([wire.Reply.json(body)])
            asyncio.run(aclient.responses.parse(**kwargs))  # type: ignore[arg-type]
        else:
            client, _ = sync_client([wire.Reply.json(body)])
            client.responses.parse(**kwargs)  # type: ignore[arg-type]
    otel.assert_finished("ValidationError")
    attrs = attributes(otel.span())
    assert attrs[sc.RESPONSE_ID] == "resp_abc" and attrs[sc.RESPONSE_FINISH_REASONS] == ("max_output_tokens",)
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS]) == (9, 3)


def _cut_stream(endpoint: str) -> wire.Reply:
    tokens = [CUT_ANSWER[:8], CUT_ANSWER[8:]]
    if endpoint == "chat":
        return wire.Reply.stream(wire.chat_stream(tokens, finish_reason="length"))
    return wire.Reply.stream(wire.responses_stream(tokens, usage=USAGE))


def _helper(client: Any, endpoint: str) -> Any:
    if endpoint == "chat":
        return client.chat.completions.stream(model="m", messages=MESSAGES, response_format=Answer)
    return client.responses.stream(model="m", input="hello", text_format=Answer)


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_stream_helper_refusing_a_structured_answer_cut_short_fails_the_call(otel: Captured, endpoint: str,
                                                                                is_async: bool) -> None:
    """The stream() helpers parse as the caller iterates, and raise on an answer cut short (chat: at the finish
    reason "length"; Responses: at the text's end), after our stream handed the chunk over: the operation fails
    with the caller's error, as the same refusal fails parse(), and not as a stream the caller stopped."""
    refused = openai.LengthFinishReasonError if endpoint == "chat" else pydantic.ValidationError
    if is_async:
        async def read() -> None:
            aclient, _ = async_client([_cut_stream(endpoint)])
            async with _helper(aclient, endpoint) as stream:
                async for _ in stream:
                    pass

        with pytest.raises(refused):
            asyncio.run(read())
    else:
        client, _ = sync_client([_cut_stream(endpoint)])
        with pytest.raises(refused), _helper(client, endpoint) as stream:
            for _ in stream:
                pass
    otel.assert_finished(refused.__name__)
    attrs = attributes(otel.span())
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] > 0 and attrs[sc.CONTENT_CHUNKS] == 2
    if endpoint == "chat":
        assert attrs[sc.RESPONSE_FINISH_REASONS] == ("length",)


def test_a_callers_own_error_inside_a_stream_helper_is_a_cancellation(otel: Captured) -> None:
    """Only what the helper raises is the call's error: the caller's own code runs outside the helper's events."""
    client, _ = sync_client([_cut_stream("responses")])
    with pytest.raises(KeyError), _helper(client, "responses") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                raise KeyError("the caller's own")
    otel.assert_finished(sc.ERROR_CANCELLED)


def test_a_streaming_response_whose_structured_answer_is_cut_fails_at_parse_and_keeps_its_usage(
        otel: Captured) -> None:
    client, _ = sync_client([_cut_reply("chat")])
    with (client.chat.completions.with_streaming_response.parse(model="m", messages=MESSAGES,
                                                                response_format=Answer) as response,
          pytest.raises(openai.LengthFinishReasonError)):
        response.parse()
    otel.assert_finished("LengthFinishReasonError")
    attrs = attributes(otel.span())
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 3 and attrs[sc.RESPONSE_FINISH_REASONS] == ("length",)


def _raw_lines(resource: Any, **kwargs: Any) -> list[str]:
    raw = resource.with_raw_response.create(**kwargs)
    return [line for line in raw.http_response.iter_lines() if line]


def _streaming_lines(resource: Any, **kwargs: Any) -> list[str]:
    with resource.with_streaming_response.create(**kwargs) as response:
        return [line for line in response.iter_lines() if line]


RAW_STREAMS = {"raw": _raw_lines, "streaming": _streaming_lines}


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("shape", RAW_STREAMS)
def test_a_raw_stream_goes_out_as_the_caller_made_it(instrument: Any, endpoint: str, shape: str) -> None:
    """A caller of a raw stream may read its SSE lines, where no usage chunk of ours could be taken out: we ask for
    no usage there, and the lines are exactly those the server sends without us."""
    def server(request: wire.RecordedRequest) -> wire.Reply:
        asked = (request.json.get("stream_options") or {}).get("include_usage") is True
        usage = USAGE if asked else None
        if endpoint == "chat":
            return wire.Reply.stream(wire.chat_stream(TOKENS, usage=usage))
        return wire.Reply.stream(wire.completion_stream(TOKENS, usage=usage))

    def lines() -> tuple[list[str], Any]:
        client, recorder = sync_client(server)
        resource = client.chat.completions if endpoint == "chat" else client.completions
        kwargs: dict[str, Any] = {"model": "m", "stream": True}
        kwargs.update({"messages": MESSAGES} if endpoint == "chat" else {"prompt": "hello"})
        return RAW_STREAMS[shape](resource, **kwargs), recorder.requests[-1].json

    bare, bare_request = lines()
    otel = instrument()
    read, request = lines()
    assert read == bare
    assert request == bare_request
    assert "stream_options" not in request
    gc.collect()
    otel.metrics()  # what a finalizer ended is written by the next collection
    # the body read by the caller to its end: complete, whether the raw response was dropped or closed
    otel.assert_finished(None)
    assert sc.USAGE_INJECTED not in attributes(otel.span())


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("shape", ["raw", "streaming"])
def test_a_raw_streams_body_the_caller_reads_itself_lasts_to_its_end(otel: Captured, shape: str,
                                                                       is_async: bool) -> None:
    """Its SSE lines read by the caller, not parsed by the client: the operation is complete when the body is,
    however the raw response is let go (dropped, or closed by its with block), and lasts until the body ended."""
    server = wire.Reply.stream(wire.chat_stream(TOKENS), delays=[0.0, 0.05, 0.05, 0.0, 0.05, 0.0])
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}

    async def read_async() -> list[str]:
        aclient, _ = async_client([server])
        if shape == "raw":
            raw = await aclient.chat.completions.with_raw_response.create(**kwargs)
            return [line async for line in raw.http_response.aiter_lines() if line]
        async with aclient.chat.completions.with_streaming_response.create(**kwargs) as response:
            return [line async for line in response.iter_lines() if line]

    if is_async:
        lines = asyncio.run(read_async())
    else:
        client, _ = sync_client([server])
        lines = RAW_STREAMS[shape](client.chat.completions, **kwargs)
    assert lines[-1] == "data: [DONE]"
    gc.collect()
    otel.metrics()  # what a finalizer ended is written by the next collection
    otel.assert_finished(None)
    span = otel.span()
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 >= 0.15  # the body's pauses, not the headers' arrival


@pytest.mark.parametrize("shape", ["raw", "streaming"])
def test_a_raw_streams_body_the_caller_stops_reading_was_not_complete(otel: Captured, shape: str) -> None:
    """Dropped after a few lines, or closed by its with block: abandoned, or cancelled, where the caller stopped."""
    client, _ = sync_client([wire.Reply.stream(wire.chat_stream(TOKENS))])
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}
    if shape == "raw":
        raw = client.chat.completions.with_raw_response.create(**kwargs)
        next(raw.http_response.iter_lines())
        del raw
        gc.collect()
        otel.metrics()
    else:
        with client.chat.completions.with_streaming_response.create(**kwargs) as response:
            next(response.iter_lines())
    otel.assert_finished(sc.ERROR_ABANDONED if shape == "raw" else sc.ERROR_CANCELLED)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_streaming_response_whose_body_the_caller_reads_itself_is_read_at_its_close(otel: Captured,
                                                                                     is_async: bool) -> None:
    """json() instead of parse(): at the close, the client's own object of that body gives the span its id and
    usage; the operation lasted until the body came, not until the caller closed it."""
    reply = wire.Reply.json(wire.chat_completion_body("xyz", usage=USAGE))

    async def read_async() -> Any:
        aclient, _ = async_client([reply])
        async with aclient.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES) as response:
            body = await response.json()
            await asyncio.sleep(0.3)
            return body

    if is_async:
        body = asyncio.run(read_async())
    else:
        client, _ = sync_client([reply])
        with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES) as response:
            body = response.json()
            time.sleep(0.3)
    assert body["usage"]["completion_tokens"] == 3
    otel.assert_finished(None)
    span = otel.span()
    attrs = attributes(span)
    assert (attrs[sc.RESPONSE_ID], attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS]) == (
        "chatcmpl-abc", 9, 3)
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 < 0.2  # the caller's 0.3 s after the body are not the call's


def test_a_streaming_response_closed_before_its_body_was_read_was_cancelled(otel: Captured) -> None:
    """The headers were all the caller wanted: the response did not come to its end."""
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("xyz", usage=USAGE))])
    with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES) as response:
        assert response.status_code == 200
    otel.assert_finished(sc.ERROR_CANCELLED)


def test_streaming_response_parse_and_exit(otel: Captured) -> None:
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES,
                                                                stream=True) as response:
        assert response.status_code == 200
        chunks = list(response.parse())
    assert len(chunks) == 5
    assert attributes(otel.span()).get(sc.ERROR_TYPE) is None
    assert otel.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


@pytest.mark.parametrize("to", [str, bytes], ids=["str", "bytes"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_streaming_response_parsed_to_the_callers_own_type_is_read_apart(otel: Captured, to: type,
                                                                           is_async: bool) -> None:
    """parse(to=str): the caller gets the body as it asked; the span reads the client's own object of it."""
    body = wire.response_body("xyz", usage=USAGE)
    if is_async:
        aclient, _ = async_client([wire.Reply.json(body)])

        async def main() -> Any:
            async with aclient.responses.with_streaming_response.create(model="gpt-4.1", input="hi") as response:
                return await response.parse(to=to)

        parsed = asyncio.run(main())
    else:
        client, _ = sync_client([wire.Reply.json(body)])
        with client.responses.with_streaming_response.create(model="gpt-4.1", input="hi") as response:
            parsed = response.parse(to=to)
    assert type(parsed) is to and wire.json.loads(parsed) == body
    otel.assert_finished(None)
    attrs = attributes(otel.span())
    assert attrs[sc.RESPONSE_ID] == "resp_abc" and attrs[sc.USAGE_OUTPUT_TOKENS] == 3


class _CallersStream(openai.Stream[ChatCompletionChunk]):
    pass


def test_a_streaming_response_parsed_to_the_callers_stream_class_is_a_stream(otel: Captured) -> None:
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES,
                                                                stream=True) as response:
        stream = response.parse(to=_CallersStream)
        assert isinstance(stream, _CallersStream)
        assert otel.spans() == []
        assert len(list(stream)) == 5
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 3


def test_streaming_response_read_raw_finishes_on_exit(otel: Captured) -> None:
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES,
                                                                stream=True) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    span = otel.span()
    assert attributes(span).get(sc.ERROR_TYPE) is None
    assert otel.point(sc.STABLE_NAMES.duration.name).count == 1


def test_async_streaming_response_plain(otel: Captured) -> None:
    client, _ = async_client(openai_server(tokens=TOKENS, usage=USAGE))

    async def main() -> str:
        async with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES) as response:
            completion = await response.parse()
        return completion.choices[0].message.content or ""

    assert asyncio.run(main()) == "xyz"
    assert attributes(otel.span())[sc.USAGE_OUTPUT_TOKENS] == 3


# --- Responses API --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_responses_stream_first_token_is_the_first_text_delta(otel: Captured, is_async: bool) -> None:
    events = wire.responses_stream(TOKENS, usage=USAGE)
    # a long pause after response.created and in_progress: they are not tokens
    reply = wire.Reply.stream(events, delays=[0, 0.03, 0, 0, 0.02])
    kwargs = {"model": "gpt-4.1", "input": "hello", "instructions": "be brief", "stream": True}
    if is_async:
        aclient, _ = async_client([reply])

        async def main() -> list[str]:
            stream = await aclient.responses.create(**kwargs)  # type: ignore[call-overload]
            return [event.type async for event in stream]

        types = asyncio.run(main())
    else:
        client, _ = sync_client([reply])
        types = [event.type for event in client.responses.create(**kwargs)]  # type: ignore[call-overload]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    span = otel.span()
    attrs = attributes(span)
    assert span.name == "chat gpt-4.1"
    assert attrs[sc.PROMPT_LENGTH] == len("hello") + len("be brief")
    assert attrs[sc.CONTENT_CHUNKS] == 3
    assert attrs[sc.RESPONSE_ID] == "resp_abc"
    assert attrs[sc.USAGE_INPUT_TOKENS] == 9 and attrs[sc.USAGE_CACHE_READ_INPUT_TOKENS] == 2
    assert attrs[sc.RESPONSE_FINISH_REASONS] == ("completed",)
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] >= 0.05
    assert sc.USAGE_INJECTED not in attrs  # the Responses API always reports usage


def test_responses_stream_helper(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.stream(wire.responses_stream(TOKENS, usage=USAGE))])
    with client.responses.stream(model="gpt-4.1", input="hello") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == "xyz"
    assert attributes(otel.span())[sc.USAGE_OUTPUT_TOKENS] == 3


def test_responses_stream_helper_early_exit(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.stream(wire.responses_stream(TOKENS, usage=USAGE))])
    with client.responses.stream(model="gpt-4.1", input="hello") as stream:
        next(iter(stream))
    assert attributes(otel.span())[sc.ERROR_TYPE] == sc.ERROR_CANCELLED


def test_responses_plain(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.json(wire.response_body("xyz", usage=USAGE))])
    response = client.responses.create(model="gpt-4.1", input=[{"role": "user", "content": "hello"}])
    assert response.output_text == "xyz"
    attrs = attributes(otel.span())
    assert attrs[sc.REQUEST_STREAM] is False
    assert attrs[sc.OPENAI_API_TYPE] == sc.OPENAI_API_RESPONSES
    assert attrs[sc.PROMPT_LENGTH] == 5
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 3
    # the API is a span's detail: the metric points of both APIs stay one series per model
    assert sc.OPENAI_API_TYPE not in otel.point(sc.STABLE_NAMES.duration.name).attributes


@pytest.mark.parametrize("given", ["conv_689667905b048191b4740501625afd940c7533ace33a2dab",
                                   {"id": "conv_689667905b048191b4740501625afd940c7533ace33a2dab"}, None],
                         ids=["id", "object", "only in the response"])
def test_a_response_in_a_conversation_names_it_on_the_span(otel: Captured, given: object) -> None:
    """gen_ai.conversation.id, which the conventions require where it is at hand: the request's conversation, or the
    one its response says it belongs to. On the span only: a metric series per conversation would have no end."""
    body = {**wire.response_body("xyz", usage=USAGE),
            "conversation": {"id": "conv_689667905b048191b4740501625afd940c7533ace33a2dab"}}
    client, recorder = sync_client([wire.Reply.json(body)])
    extra = {} if given is None else {"conversation": given}
    client.responses.create(model="gpt-4.1", input="hello", **extra)  # type: ignore[arg-type]
    assert ("conversation" in recorder.requests[0].json) is (given is not None)
    assert attributes(otel.span())[sc.CONVERSATION_ID] == "conv_689667905b048191b4740501625afd940c7533ace33a2dab"
    assert sc.CONVERSATION_ID not in otel.point(sc.STABLE_NAMES.duration.name).attributes


def test_a_stored_response_streamed_again_names_the_conversation_its_events_say(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.stream(wire.responses_stream(TOKENS, usage=USAGE, conversation="conv_9"))])
    assert len(list(client.responses.retrieve("resp_abc", stream=True))) > len(TOKENS)
    assert attributes(otel.span())[sc.CONVERSATION_ID] == "conv_9"


def test_a_response_in_no_conversation_names_none(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.json(wire.response_body("xyz", usage=USAGE))])
    client.responses.create(model="gpt-4.1", input="hello")
    assert sc.CONVERSATION_ID not in attributes(otel.span())


def test_responses_prompt_length_counts_earlier_tool_calls_their_outputs_and_refusals(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.json(wire.response_body("xyz", usage=USAGE))])
    client.responses.create(model="gpt-4.1", instructions="be brief", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "sql", "input": "SELECT 1"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "1"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
    ])
    expected = (len("be brief") + len("weather?") + len('{"city": "Paris"}') + len("sunny") + len("SELECT 1")
                + len("1") + len("No."))
    assert attributes(otel.span())[sc.PROMPT_LENGTH] == expected


def _resume_helper(client: openai.OpenAI) -> None:
    with client.responses.stream(response_id="resp_abc", starting_after=3) as stream:
        stream.until_done()


def _resume_helper_async(client: openai.AsyncOpenAI) -> None:
    async def main() -> None:
        async with client.responses.stream(response_id="resp_abc") as stream:
            await stream.until_done()

    asyncio.run(main())


def _retrieve_async(client: openai.AsyncOpenAI) -> None:
    async def main() -> None:
        async for _ in await client.responses.retrieve("resp_abc", stream=True, starting_after=3):
            pass

    asyncio.run(main())


@pytest.mark.parametrize("resume, is_async", [
    (lambda client: list(client.responses.retrieve("resp_abc", stream=True, starting_after=3)), False),
    (_retrieve_async, True),
    (_resume_helper, False),
    (_resume_helper_async, True),
], ids=["retrieve", "async retrieve", "stream() helper", "async stream() helper"])
def test_a_background_response_streamed_again_is_an_operation(otel: Captured, resume: Any, is_async: bool) -> None:
    """Resuming a background response's stream reads its output as it comes: TTFT from the resuming request."""
    reply = wire.Reply.stream(wire.responses_stream(TOKENS, usage=USAGE), delays=[0, 0, 0, 0, 0.03])
    client = async_client([reply])[0] if is_async else sync_client([reply])[0]
    resume(client)
    otel.assert_finished(None)
    span = otel.span()
    attrs = attributes(span)
    assert span.name == "chat" and sc.REQUEST_MODEL not in attrs
    assert attrs[sc.RESPONSE_ID] == "resp_abc" and attrs[sc.USAGE_OUTPUT_TOKENS] == 3
    assert attrs[sc.CONTENT_CHUNKS] == 3 and attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] >= 0.03


@pytest.mark.parametrize("status", ["queued", "in_progress"])
def test_a_background_response_not_finished_when_created_has_no_finish_reason(otel: Captured, status: str) -> None:
    body = {**wire.response_body("", usage=None), "status": status, "background": True, "output": [],
            "completed_at": None}
    client, _ = sync_client([wire.Reply.json(body)])
    assert client.responses.create(model="gpt-4.1", input="hello", background=True).status == status
    otel.assert_finished(None)
    attrs = attributes(otel.span())
    assert attrs[sc.RESPONSE_ID] == "resp_abc" and sc.RESPONSE_FINISH_REASONS not in attrs


def test_retrieving_a_stored_response_calls_no_model(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.json(wire.response_body("xyz", usage=USAGE))])
    assert client.responses.retrieve("resp_abc").output_text == "xyz"
    assert otel.spans() == [] and otel.metrics() == {}


COMPACT_INPUT = [{"role": "user", "content": "Plan a trip"}, {"role": "assistant", "content": "Paris, 3 days"},
                 {"role": "user", "content": "Make it cheaper"}]
COMPACT_USAGE = wire.Usage(input=1200, output=80, cached=1000, reasoning=40)


def _compact(resource: Any, how: str) -> Any:
    if how == "with_raw_response":
        return resource.with_raw_response.compact(model="gpt-5.4", input=COMPACT_INPUT).parse()
    if how == "with_streaming_response":
        with resource.with_streaming_response.compact(model="gpt-5.4", input=COMPACT_INPUT) as response:
            return response.parse()
    return resource.compact(model="gpt-5.4", input=COMPACT_INPUT)


async def _compact_async(resource: Any, how: str) -> Any:
    if how == "with_raw_response":
        return (await resource.with_raw_response.compact(model="gpt-5.4", input=COMPACT_INPUT)).parse()
    if how == "with_streaming_response":
        async with resource.with_streaming_response.compact(model="gpt-5.4", input=COMPACT_INPUT) as response:
            return await response.parse()
    return await resource.compact(model="gpt-5.4", input=COMPACT_INPUT)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("how", ["compact", "with_raw_response", "with_streaming_response"])
@pytest.mark.parametrize("api", ["responses", "beta.responses"])
def test_a_compaction_is_a_chat_operation_billed_in_tokens(otel: Captured, is_async: bool, how: str,
                                                            api: str) -> None:
    """responses.compact() runs the model over the conversation: its wait and its tokens are the application's as
    much as an answer's. No model is named in its response, and it has no finish reason."""
    body = wire.compaction_body(["Plan a trip", "Make it cheaper"], usage=COMPACT_USAGE)
    client, recorder = (async_client if is_async else sync_client)([wire.Reply.json(body)])
    resource = client.beta.responses if api == "beta.responses" else client.responses
    result = asyncio.run(_compact_async(resource, how)) if is_async else _compact(resource, how)
    assert recorder.requests[0].path == "/v1/responses/compact"
    compacted = "BetaCompactedResponse" if api == "beta.responses" else "CompactedResponse"
    assert (type(result).__name__, result.id, [item.type for item in result.output]) == (
        compacted, "cmp_abc", ["message", "message", "compaction"])

    span = otel.span()
    assert (span.name, span.status.status_code) == ("chat gpt-5.4", trace.StatusCode.UNSET)
    attrs = dict(attributes(span))
    assert attrs.pop(sc.TIME_TO_HEADERS) > 0
    assert attrs == {
        sc.OPERATION_NAME: "chat", sc.PROVIDER_NAME: "openai", sc.REQUEST_MODEL: "gpt-5.4",
        sc.SERVER_ADDRESS: "api.openai.com", sc.SERVER_PORT: 443,
        sc.OPENAI_API_TYPE: sc.OPENAI_API_RESPONSES,
        sc.REQUEST_STREAM: False,
        sc.PROMPT_LENGTH: len("Plan a tripParis, 3 daysMake it cheaper"),
        sc.RESPONSE_ID: "cmp_abc",
        sc.OPENAI_RESPONSE_SERVICE_TIER: "default",
        sc.USAGE_INPUT_TOKENS: 1200,
        sc.USAGE_OUTPUT_TOKENS: 80,
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 1000,
        sc.USAGE_CACHE_CREATION_INPUT_TOKENS: 0,  # as the server reports it
        sc.USAGE_REASONING_OUTPUT_TOKENS: 40,
    }
    assert otel.point(sc.STABLE_NAMES.duration.name).count == 1
    usage_name = sc.STABLE_NAMES.token_usage.name  # type: ignore[union-attr]
    assert [otel.point(usage_name, gen_ai__token__type=kind).sum for kind in ("input", "output")] == [1200, 80]


def test_a_refused_compaction_passes_the_clients_error_and_is_recorded_under_its_class(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.json(wire.error_body("Rate limit reached", type="requests"), status=429)])
    with pytest.raises(openai.RateLimitError, match="Rate limit reached"):
        client.responses.compact(model="gpt-5.4", input=COMPACT_INPUT)
    span = otel.span()
    assert (span.status.status_code, attributes(span)[sc.ERROR_TYPE]) == (trace.StatusCode.ERROR, "RateLimitError")


DECISION_INPUT = [{"role": "developer", "content": "Triage support tickets."},
                  {"role": "user", "content": [{"type": "input_text", "text": "My card was charged twice."},
                                               {"type": "input_json", "data": {"order": 4417}}]}]
DECISION_QUESTIONS = [
    {"type": "predicate", "name": "urgent", "instructions": "Is it urgent?"},
    {"type": "choice", "instructions": "Which team?", "choices": [{"value": "billing", "description": "payments"},
                                                                  {"value": "tech"}]},
    {"type": "score", "instructions": [{"type": "input_text", "text": "How angry?"}],
     "levels": [{"label": "calm"}, {"label": "furious", "description": "all caps"}]},
]
# every text the model reads: the input's, the JSON part as sent, and the questions' instructions, choices and levels
DECISION_CHARS = len("Triage support tickets." "My card was charged twice." '{"order":4417}'
                     "Is it urgent?" "Which team?" "billing" "payments" "tech" "How angry?" "calm" "furious" "all caps")
DECISION_ANSWERS = [
    {"type": "predicate", "name": "urgent", "probability": 0.91},
    {"type": "choice", "name": None, "choice": "billing", "confidence": 0.97,
     "probabilities": [{"value": "billing", "probability": 0.97}, {"value": "tech", "probability": 0.03}]},
    {"type": "refusal", "name": None},
]
DECISION_USAGE = wire.Usage(input=900, output=12, cached=640, cache_write=200, reasoning=0)


def _decide(resource: Any, how: str) -> Any:
    kwargs = {"model": "gpt-6-luna", "input": DECISION_INPUT, "questions": DECISION_QUESTIONS}
    if how == "with_raw_response":
        return resource.with_raw_response.create(**kwargs).parse()
    if how == "with_streaming_response":
        with resource.with_streaming_response.create(**kwargs) as response:
            return response.parse()
    return resource.create(**kwargs)


async def _decide_async(resource: Any, how: str) -> Any:
    kwargs = {"model": "gpt-6-luna", "input": DECISION_INPUT, "questions": DECISION_QUESTIONS}
    if how == "with_raw_response":
        return (await resource.with_raw_response.create(**kwargs)).parse()
    if how == "with_streaming_response":
        async with resource.with_streaming_response.create(**kwargs) as response:
            return await response.parse()
    return await resource.create(**kwargs)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("how", ["create", "with_raw_response", "with_streaming_response"])
def test_a_decision_is_a_chat_operation_billed_in_tokens(otel: Captured, is_async: bool, how: str) -> None:
    """decisions.create() runs the model over an input to answer questions about it: its wait and its tokens
    (cache reads and writes among them) are the application's as an answer's are. Its response names the model and
    no id or finish reason; its prompt is the input and the questions both."""
    body = wire.decision_body(DECISION_ANSWERS, usage=DECISION_USAGE)
    client, recorder = (async_client if is_async else sync_client)([wire.Reply.json(body)])
    result = asyncio.run(_decide_async(client.decisions, how)) if is_async else _decide(client.decisions, how)
    assert recorder.requests[0].path == "/v1/decisions"
    assert (type(result).__name__, [answer.type for answer in result.answers]) == (
        "Decision", ["predicate", "choice", "refusal"])

    span = otel.span()
    assert (span.name, span.status.status_code) == ("chat gpt-6-luna", trace.StatusCode.UNSET)
    attrs = dict(attributes(span))
    assert attrs.pop(sc.TIME_TO_HEADERS) > 0
    assert attrs == {
        sc.OPERATION_NAME: "chat", sc.PROVIDER_NAME: "openai", sc.REQUEST_MODEL: "gpt-6-luna",
        sc.SERVER_ADDRESS: "api.openai.com", sc.SERVER_PORT: 443,
        sc.OPENAI_API_TYPE: sc.OPENAI_API_DECISIONS,
        sc.REQUEST_STREAM: False,
        sc.PROMPT_LENGTH: DECISION_CHARS,
        sc.RESPONSE_MODEL: "gpt-6-luna",
        sc.USAGE_INPUT_TOKENS: 900,
        sc.USAGE_OUTPUT_TOKENS: 12,
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 640,
        sc.USAGE_CACHE_CREATION_INPUT_TOKENS: 200,
        sc.USAGE_REASONING_OUTPUT_TOKENS: 0,
    }
    duration = otel.point(sc.STABLE_NAMES.duration.name)
    assert (duration.count, duration.attributes[sc.RESPONSE_MODEL]) == (1, "gpt-6-luna")
    assert otel.point(sc.STABLE_NAMES.prompt_length.name).sum == DECISION_CHARS
    usage_name = sc.STABLE_NAMES.token_usage.name  # type: ignore[union-attr]
    assert [otel.point(usage_name, gen_ai__token__type=kind).sum for kind in ("input", "output")] == [900, 12]


def test_a_refused_decision_passes_the_clients_error_and_is_recorded_under_its_class(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.json(wire.error_body("Rate limit reached", type="requests"), status=429)])
    with pytest.raises(openai.RateLimitError, match="Rate limit reached"):
        client.decisions.create(model="gpt-6-luna", input="My card was charged twice.",
                                questions=DECISION_QUESTIONS[:1])
    span = otel.span()
    assert (span.status.status_code, attributes(span)[sc.ERROR_TYPE]) == (trace.StatusCode.ERROR, "RateLimitError")
    assert attributes(span)[sc.PROMPT_LENGTH] == len("My card was charged twice." "Is it urgent?")


# the attributes that hold times, which differ call to call
_TIMES = frozenset((sc.RESPONSE_TIME_TO_FIRST_CHUNK, sc.TIME_PER_OUTPUT_TOKEN, sc.MAX_CHUNK_GAP, sc.TIME_TO_HEADERS))


def _responses_call(resource: Any, call: str) -> Any:
    if call == "retrieve, streamed":
        return resource.retrieve("resp_abc", stream=True)
    return resource.create(model="gpt-4.1", input="hello", instructions="be brief", stream=call == "create, streamed")


async def _read_async(result: Any) -> Any:
    result = await result
    return [event async for event in result] if isinstance(result, openai.AsyncStream) else result


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("call", ["create", "create, streamed", "retrieve, streamed"])
def test_the_beta_responses_api_is_recorded_as_the_responses_api(otel: Captured, is_async: bool, call: str) -> None:
    """client.beta.responses (openai 3.x): its own resource, path and types, the same operation as responses."""
    reply = (wire.Reply.json(wire.response_body("xyz", usage=USAGE)) if call == "create"
             else wire.Reply.stream(wire.responses_stream(TOKENS, usage=USAGE)))
    client = (async_client if is_async else sync_client)([reply, reply])[0]
    got = []
    for resource in (client.responses, client.beta.responses):
        result = _responses_call(resource, call)
        got.append(asyncio.run(_read_async(result)) if is_async else
                   list(result) if isinstance(result, openai.Stream) else result)
    ga, beta = (type(result[-1] if isinstance(result, list) else result).__name__ for result in got)
    assert beta == f"Beta{ga}"  # each resource's own types
    spans = otel.spans()
    assert len(spans) == 2
    ga_attrs, beta_attrs = ({k: v for k, v in attributes(span).items() if k not in _TIMES} for span in spans)
    assert beta_attrs == ga_attrs and spans[1].name == spans[0].name
    assert ga_attrs[sc.USAGE_OUTPUT_TOKENS] == 3 and ga_attrs[sc.RESPONSE_ID] == "resp_abc"
    assert {point.count for point in otel.points("gen_ai.client.operation.duration")} == {2}  # one series


def _responses_events(*events: tuple[str, dict[str, Any]]) -> list[bytes]:
    return [wire.sse({"type": kind, "sequence_number": n, **data}, event=kind) for n, (kind, data) in
            enumerate(events)]


_ANSWER_AT = {"item_id": wire.MESSAGE_ID, "output_index": 1, "content_index": 0}


def _reasoned_answer(summary: bool, answer: list[str], usage: wire.Usage) -> list[bytes]:
    """A reasoning model's Responses stream: a reasoning item (with a streamed summary, or none), then the answer."""
    summary_at = {"item_id": "rs_1", "output_index": 0, "summary_index": 0}
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Sum."}] if summary
                 else []}
    message = wire._message_item("".join(answer))
    return _responses_events(
        ("response.created", {"response": wire._response("resp_r", "o4-mini", "in_progress", [], None)}),
        ("response.output_item.added", {"output_index": 0, "item": {**reasoning, "summary": []}}),
        *([("response.reasoning_summary_text.delta", {**summary_at, "delta": "Sum."})] if summary else []),
        ("response.output_item.done", {"output_index": 0, "item": reasoning}),
        ("response.output_item.added", {"output_index": 1, "item": {**message, "status": "in_progress",
                                                                    "content": []}}),
        *[("response.output_text.delta", {**_ANSWER_AT, "delta": token, "logprobs": []}) for token in answer],
        ("response.completed", {"response": wire._response("resp_r", "o4-mini", "completed", [reasoning, message],
                                                           usage)}),
    )


@pytest.mark.parametrize("summary", [False, True], ids=["no summary", "summary streamed"])
@pytest.mark.timing  # TPOT from pauses of 10-20 ms, within 4 ms
def test_responses_time_per_output_token_is_the_answers_own_after_unseen_reasoning(otel: Captured,
                                                                                    summary: bool) -> None:
    """A reasoning summary streams first and shows the model at work (TTFT is its first delta); then the model
    reasons unseen for 200 ms, 100 reasoning tokens that never stream. The answer's five tokens, 10 ms apart, are
    what TPOT times."""
    usage = wire.Usage(input=10, output=105, reasoning=100)
    delays = [0, 0, 0, 0.2, 0, 0, 0.01, 0.01, 0.01, 0.01] if summary else [0, 0, 0.2, 0, 0, 0.01, 0.01, 0.01, 0.01]
    client, _ = sync_client([wire.Reply.stream(_reasoned_answer(summary, list("abcde"), usage), delays=delays)])
    list(client.responses.create(model="o4-mini", input="2+2?", stream=True))
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == 5 + summary
    assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(0.01, abs=0.004)
    assert (attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] < 0.1) is summary


# what a tool the service runs itself streams (the last event says it is done), and the output item it leaves
HOSTED_TOOLS: dict[str, tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]] = {
    "web search": ([("response.web_search_call.in_progress", {"output_index": 1, "item_id": "ws_1"}),
                    ("response.web_search_call.searching", {"output_index": 1, "item_id": "ws_1"}),
                    ("response.web_search_call.completed", {"output_index": 1, "item_id": "ws_1"})],
                   {"id": "ws_1", "type": "web_search_call", "status": "completed"}),
    "shell in a container": (
        [("response.shell_call_output_content.delta", {"output_index": 1, "item_id": "sho_1", "command_index": 0,
                                                       "delta": {"stdout": "a.txt\n"}}),
         ("response.shell_call_output_content.done", {"output_index": 1, "item_id": "sho_1", "command_index": 0,
                                                      "output": [{"stdout": "a.txt\n", "stderr": "",
                                                                  "outcome": {"type": "exit", "exit_code": 0}}]})],
        {"id": "sho_1", "type": "shell_call_output", "call_id": "call_sh", "status": "completed", "output": []}),
}


@pytest.mark.parametrize("tool", list(HOSTED_TOOLS))
@pytest.mark.timing  # TPOT from pauses of 10-20 ms, within 4 ms
def test_responses_time_per_output_token_leaves_out_a_hosted_tools_wait(otel: Captured, tool: str) -> None:
    """A tool the service runs between two stretches of text: 300 ms with no decoding."""
    tool_events, item = HOSTED_TOOLS[tool]
    text = [("response.output_text.delta", {**_ANSWER_AT, "delta": token, "logprobs": []}) for token in "abcdef"]
    events = _responses_events(
        ("response.created", {"response": wire._response("resp_1", "gpt-5", "in_progress", [], None)}),
        *text[:3],
        *tool_events,
        *text[3:],
        ("response.completed", {"response": wire._response("resp_1", "gpt-5", "completed", [item],
                                                           wire.Usage(input=9, output=6))}),
    )
    delays = [0, 0, 0.02, 0.02, *[0] * len(tool_events), 0.3, 0.02, 0.02]
    client, _ = sync_client([wire.Reply.stream(events, delays=delays)])
    list(client.responses.create(model="gpt-5", input="news?", stream=True))
    attrs = attributes(otel.span())
    assert attrs[sc.MAX_CHUNK_GAP] >= 0.3
    assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(0.02 * 4 / 5, abs=0.004)


@pytest.mark.parametrize("event, data", [
    ("response.shell_call_command.delta", {"output_index": 0, "delta": "ls -la"}),
    ("response.output_text.delta", {**_ANSWER_AT, "delta": "x", "logprobs": []}),
], ids=["shell command", "text"])
def test_responses_first_token_is_the_first_non_empty_output_delta(otel: Captured, event: str,
                                                                   data: dict[str, Any]) -> None:
    """An empty text delta, which a server may open with, carries no token; the model writing a shell call does."""
    events = _responses_events(
        ("response.created", {"response": wire._response("resp_1", "gpt-5", "in_progress", [], None)}),
        ("response.output_text.delta", {**_ANSWER_AT, "delta": "", "logprobs": []}),
        (event, data),
        ("response.completed", {"response": wire._response("resp_1", "gpt-5", "completed", [], USAGE)}),
    )
    client, _ = sync_client([wire.Reply.stream(events, delays=[0, 0, 0.05])])
    list(client.responses.create(model="gpt-5", input="hello", stream=True))
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == 1
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] >= 0.05


def _stop_at_completed_in_a_with_block(client: openai.OpenAI) -> None:
    with client.responses.create(model="gpt-4.1", input="hello", stream=True) as stream:
        for event in stream:
            if event.type == "response.completed":
                break


def _stop_at_completed_and_drop(client: openai.OpenAI) -> None:
    for event in client.responses.create(model="gpt-4.1", input="hello", stream=True):
        if event.type == "response.completed":
            return  # the stream is dropped unclosed


def _stop_at_completed_in_the_helper(client: openai.OpenAI) -> None:
    with client.responses.stream(model="gpt-4.1", input="hello") as stream:
        for event in stream:
            if event.type == "response.completed":
                break


@pytest.mark.parametrize("stop", [_stop_at_completed_in_a_with_block, _stop_at_completed_and_drop,
                                  _stop_at_completed_in_the_helper], ids=["with block", "dropped", "stream() helper"])
def test_a_responses_caller_that_stops_at_response_completed_has_not_cancelled(otel: Captured, stop: Any) -> None:
    client, _ = sync_client([wire.Reply.stream(wire.responses_stream(TOKENS, usage=USAGE))])
    stop(client)
    gc.collect()
    otel.metrics()  # a dropped stream is written by the next collection
    otel.assert_finished(None)
    attrs = attributes(otel.span())
    assert attrs[sc.RESPONSE_FINISH_REASONS] == ("completed",)
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 3


def _failed_response(error: dict[str, Any] | None) -> dict[str, Any]:
    failed = wire._response("resp_1", "gpt-4.1", "failed", [], None)
    failed["error"] = error
    return failed


@pytest.mark.parametrize("last, error_type", [
    (("response.failed", {"response": _failed_response({"code": "server_error", "message": "The model failed"})}),
     "server_error"),
    (("response.failed", {"response": _failed_response(None)}), "failed"),
    (("error", {"code": "rate_limit_exceeded", "message": "Slow down", "param": None}), "rate_limit_exceeded"),
], ids=["response.failed", "response.failed without a code", "error event"])
def test_a_responses_stream_the_service_fails_is_an_error(otel: Captured, last: Any, error_type: str) -> None:
    """The client hands these on as events and raises nothing: the failure is the service's, named by its code."""
    created = ("response.created", {"response": wire._response("resp_1", "gpt-4.1", "in_progress", [], None)})
    delta = ("response.output_text.delta", {"item_id": "m", "output_index": 0, "content_index": 0, "delta": "x",
                                            "logprobs": []})
    client, _ = sync_client([wire.Reply.stream(_responses_events(created, delta, last))])
    seen = [event.type for event in client.responses.create(model="gpt-4.1", input="hello", stream=True)]
    assert seen == ["response.created", "response.output_text.delta", last[0]]
    otel.assert_finished(error_type)


# --- legacy completions and embeddings ------------------------------------------------------------------------


def test_legacy_completion_stream(otel: Captured) -> None:
    def answer(request: wire.RecordedRequest) -> wire.Reply:
        asked = request.json.get("stream_options", {}).get("include_usage")
        return wire.Reply.stream(wire.completion_stream(TOKENS, usage=USAGE if asked else None))

    client, _ = sync_client(answer)
    chunks = list(client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Once", stream=True))
    assert [c.choices[0].text for c in chunks] == ["x", "y", "z", ""]
    span = otel.span()
    assert span.name == "text_completion gpt-3.5-turbo-instruct"
    attrs = attributes(span)
    assert (attrs[sc.OPERATION_NAME], attrs[sc.OPENAI_API_TYPE]) == ("text_completion", "completions")
    assert attrs[sc.CONTENT_CHUNKS] == 3
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 3


def test_embeddings(otel: Captured) -> None:
    body = wire.embedding_body(2, usage_prompt_tokens=6)
    client, _ = sync_client([wire.Reply.json(body)])
    result = client.embeddings.create(model="text-embedding-3-small", input=["ab", "cde"], dimensions=2,
                                      encoding_format="float")
    assert len(result.data) == 2
    attrs = attributes(otel.span())
    assert (attrs[sc.OPERATION_NAME], attrs[sc.OPENAI_API_TYPE]) == ("embeddings", "embeddings")
    assert (attrs[sc.EMBEDDINGS_DIMENSION_COUNT], attrs[sc.REQUEST_ENCODING_FORMATS]) == (2, ("float",))
    assert attrs[sc.PROMPT_LENGTH] == 5
    assert attrs[sc.USAGE_INPUT_TOKENS] == 6
    assert sc.USAGE_OUTPUT_TOKENS not in attrs
    usage_name = sc.STABLE_NAMES.token_usage.name  # type: ignore[union-attr]
    assert otel.points(usage_name, gen_ai__token__type="output") == []


def test_embeddings_have_a_duration_and_input_tokens_of_their_own_under_the_newer_names(instrument: Any) -> None:
    """The GenAI conventions repository (client-embeddings.md) reports embeddings apart from inference: on
    gen_ai.client.embeddings.duration and .operation.input_tokens, and on no inference usage counter."""
    captured = instrument(OTEL_SEMCONV_STABILITY_OPT_IN=sc.LATEST_EXPERIMENTAL_OPT_IN)
    client, _ = sync_client([wire.Reply.json(wire.embedding_body(2, usage_prompt_tokens=6)),
                             wire.Reply.json(wire.chat_completion_body("xyz", usage=USAGE))])
    client.embeddings.create(model="text-embedding-3-small", input=["ab", "cde"])
    client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)

    names = sc.LATEST_EXPERIMENTAL_NAMES
    assert names.embeddings_duration is not None and names.embeddings_input_tokens is not None
    duration = captured.point(names.embeddings_duration.name)
    assert (duration.count, duration.attributes[sc.OPERATION_NAME]) == (1, "embeddings")
    assert tuple(duration.explicit_bounds) == sc.LATEST_EXPERIMENTAL_NAMES.duration.buckets  # summed with it
    tokens = captured.point(names.embeddings_input_tokens.name)
    assert (tokens.count, tokens.sum, tuple(tokens.explicit_bounds)) == (1, 6, sc.COUNT_BUCKETS)
    # the chat call is the only inference
    assert [point.attributes[sc.OPERATION_NAME] for point in captured.points(names.duration.name)] == ["chat"]
    assert captured.point(names.input_tokens.name).sum == 9  # type: ignore[union-attr]
    assert captured.point(names.input_token_counter.name).value == 9  # type: ignore[union-attr]
    assert {name for name in captured.metrics() if name.startswith("gen_ai.")} == {
        "gen_ai.client.embeddings.duration", "gen_ai.client.embeddings.operation.input_tokens",
        "gen_ai.client.inference.duration", "gen_ai.client.inference.operation.input_tokens",
        "gen_ai.client.inference.operation.output_tokens", "gen_ai.client.inference.usage.input_tokens",
        "gen_ai.client.inference.usage.output_tokens", "gen_ai.client.inference.usage.cache_read.input_tokens",
        "gen_ai.client.inference.usage.cache_write.input_tokens",
        "gen_ai.client.inference.usage.reasoning.output_tokens"}


@pytest.mark.parametrize("prompt_tokens", ["6", -6, [6], None])
def test_embeddings_usage_that_is_no_count_is_left_out_and_the_duration_kept(otel: Captured,
                                                                            prompt_tokens: object) -> None:
    """Found by mutating responses at the wire: a usage of another type made the call lose every metric point."""
    body = wire.embedding_body(2, usage_prompt_tokens=6)
    body["usage"]["prompt_tokens"] = prompt_tokens
    client, _ = sync_client([wire.Reply.json(body)])
    client.embeddings.create(model="text-embedding-3-small", input=["ab", "cde"])
    assert sc.USAGE_INPUT_TOKENS not in attributes(otel.span())
    assert otel.points(sc.STABLE_NAMES.token_usage.name) == []  # type: ignore[union-attr]
    assert otel.point(sc.STABLE_NAMES.duration.name).count == 1


# --- where the client points ----------------------------------------------------------------------------------


def test_openai_compatible_server_gets_its_own_address(otel: Captured) -> None:
    with wire.LoopbackServer(openai_server(tokens=TOKENS, usage=USAGE)) as server:
        client = openai.OpenAI(api_key="none", base_url=server.base_url, max_retries=0)
        list(client.chat.completions.create(model="llama-3", messages=MESSAGES, stream=True))
        port = int(server.base_url.split(":")[2].split("/")[0])
    attrs = attributes(otel.span())
    assert (attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT]) == ("127.0.0.1", port)
    assert attrs[sc.PROVIDER_NAME] == "openai"


def test_known_compatible_provider_is_named(otel: Captured) -> None:
    http, _ = wire.mock_client(openai_server(tokens=TOKENS, usage=USAGE))
    client = openai.OpenAI(api_key="k", base_url="https://api.groq.com/openai/v1", http_client=http)
    client.chat.completions.create(model="llama-3.3-70b", messages=MESSAGES)
    assert attributes(otel.span())[sc.PROVIDER_NAME] == sc.PROVIDER_GROQ


def test_a_client_pointed_elsewhere_reports_its_new_server(otel: Captured) -> None:
    http, _ = wire.mock_client(openai_server(tokens=TOKENS, usage=USAGE))
    client = openai.OpenAI(api_key="k", http_client=http)
    client.chat.completions.create(model="m", messages=MESSAGES)
    client.base_url = "https://api.groq.com:8443/openai/v1"  # type: ignore[assignment]
    client.chat.completions.create(model="m", messages=MESSAGES)
    first, second = (attributes(span) for span in otel.spans())
    assert (first[sc.PROVIDER_NAME], first[sc.SERVER_ADDRESS], first[sc.SERVER_PORT]) == (
        "openai", "api.openai.com", 443)
    assert (second[sc.PROVIDER_NAME], second[sc.SERVER_ADDRESS], second[sc.SERVER_PORT]) == (
        sc.PROVIDER_GROQ, "api.groq.com", 8443)


def test_the_module_level_client_reports_the_server_it_is_pointed_at(otel: Captured,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``openai.chat.completions.create`` with ``openai.base_url`` set: that global is the client's base URL, read at
    every call, and moving it moves the next span's server."""
    http, _ = wire.mock_client(openai_server(tokens=TOKENS, usage=USAGE))
    for name, value in (("_client", None), ("api_key", "k"), ("http_client", http),
                        ("base_url", "https://api.groq.com/openai/v1")):
        monkeypatch.setattr(openai, name, value)
    openai.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[attr-defined]
    monkeypatch.setattr(openai, "base_url", "http://gpu-box:8000/v1")
    openai.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[attr-defined]
    first, second = (attributes(span) for span in otel.spans())
    assert (first[sc.PROVIDER_NAME], first[sc.SERVER_ADDRESS], first[sc.SERVER_PORT]) == (
        sc.PROVIDER_GROQ, "api.groq.com", 443)
    assert (second[sc.PROVIDER_NAME], second[sc.SERVER_ADDRESS], second[sc.SERVER_PORT]) == (
        "openai", "gpu-box", 8000)


def test_a_base_url_property_patched_onto_the_client_class_later_is_asked(otel: Captured,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A library (or mock.patch with a PropertyMock) that replaces the class's base_url after the first call sends
    the requests elsewhere: the spans follow it."""
    http, _ = wire.mock_client(openai_server(tokens=TOKENS, usage=USAGE))

    class Client(openai.OpenAI):
        pass

    client = Client(api_key="k", http_client=http, max_retries=0)
    client.chat.completions.create(model="m", messages=MESSAGES)
    monkeypatch.setattr(Client, "base_url", property(lambda self: httpx2.URL("https://gw.example.com:9443/v1/")),
                        raising=False)
    client.chat.completions.create(model="m", messages=MESSAGES)
    first, second = (attributes(span) for span in otel.spans())
    assert (first[sc.SERVER_ADDRESS], first[sc.SERVER_PORT]) == ("api.openai.com", 443)
    assert (second[sc.SERVER_ADDRESS], second[sc.SERVER_PORT]) == ("gw.example.com", 9443)


@pytest.mark.parametrize(("parameters", "expected"), [
    ({}, {}),
    # doubles in the conventions, whatever the caller wrote (temperature=0): one attribute, one type
    ({"temperature": 0, "top_p": 0.9, "frequency_penalty": -0.5, "presence_penalty": 1, "seed": 7},
     {sc.REQUEST_TEMPERATURE: 0.0, sc.REQUEST_TOP_P: 0.9, sc.REQUEST_FREQUENCY_PENALTY: -0.5,
      sc.REQUEST_PRESENCE_PENALTY: 1.0, sc.REQUEST_SEED: 7}),
    ({"max_tokens": 50, "max_completion_tokens": 70}, {sc.REQUEST_MAX_TOKENS: 70}),  # the newer name wins
    ({"max_tokens": 50}, {sc.REQUEST_MAX_TOKENS: 50}),
    ({"n": 3, "stop": "END"}, {sc.REQUEST_CHOICE_COUNT: 3, sc.REQUEST_STOP_SEQUENCES: ("END",)}),
    ({"n": 1, "stop": ["a", "b"]}, {sc.REQUEST_STOP_SEQUENCES: ("a", "b")}),
    ({"temperature": None, "seed": True, "stop": None, "n": None}, {}),  # nothing that is not a number or text
], ids=["none", "sampling", "max-completion-tokens", "max-tokens", "n-and-stop", "stop-list", "not-numbers"])
def test_request_parameters_on_the_span(otel: Captured, parameters: dict[str, object],
                                        expected: dict[str, object]) -> None:
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    client.chat.completions.create(model="m", messages=MESSAGES, **parameters)  # type: ignore[call-overload]
    attrs = attributes(otel.span())
    names = (sc.REQUEST_TEMPERATURE, sc.REQUEST_TOP_P, sc.REQUEST_FREQUENCY_PENALTY, sc.REQUEST_PRESENCE_PENALTY,
             sc.REQUEST_SEED, sc.REQUEST_MAX_TOKENS, sc.REQUEST_CHOICE_COUNT, sc.REQUEST_STOP_SEQUENCES)
    assert {name: (attrs[name], type(attrs[name])) for name in names if name in attrs} == {
        name: (value, type(value)) for name, value in expected.items()}


@pytest.mark.parametrize(("call", "expected"), [
    (lambda client: client.chat.completions.create(model="m", messages=MESSAGES), None),
    (lambda client: client.chat.completions.create(model="m", messages=MESSAGES,
                                                   response_format={"type": "json_object"}), "json"),
    (lambda client: client.chat.completions.create(model="m", messages=MESSAGES,
                                                   response_format={"type": "text"}), "text"),
    (lambda client: client.chat.completions.parse(model="m", messages=MESSAGES, response_format=Answer), "json"),
    (lambda client: client.responses.create(model="m", input="hello", text={"format": {
        "type": "json_schema", "name": "answer", "schema": Answer.model_json_schema()}}), "json"),
    (lambda client: client.responses.parse(model="m", input="hello", text_format=Answer), "json"),
], ids=["none", "json_object", "text", "chat parse", "responses json_schema", "responses parse"])
def test_the_output_format_a_request_names_is_its_output_type(otel: Captured, call: Any,
                                                              expected: str | None) -> None:
    def answer(request: wire.RecordedRequest) -> wire.Reply:
        if request.path.endswith("/responses"):
            return wire.Reply.json(wire.response_body('{"city": "Paris"}', usage=USAGE))
        return wire.Reply.json(wire.chat_completion_body('{"city": "Paris"}', usage=USAGE))

    client, _ = sync_client(answer)
    call(client)
    assert attributes(otel.span()).get(sc.OUTPUT_TYPE) == expected


def test_azure_openai(otel: Captured) -> None:
    http, recorder = wire.mock_client(openai_server(tokens=TOKENS, usage=USAGE))
    client = openai.AzureOpenAI(api_key=API_KEY, api_version="2024-10-21", http_client=http,
                                azure_endpoint="https://myres.openai.azure.com", azure_deployment="prod-4o")
    client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert "/openai/deployments/prod-4o/" in recorder.requests[0].path
    attrs = attributes(otel.span())
    assert attrs[sc.PROVIDER_NAME] == sc.PROVIDER_AZURE_OPENAI
    assert attrs[sc.SERVER_ADDRESS] == "myres.openai.azure.com"
    assert attrs[sc.SERVER_PORT] == 443


@pytest.mark.parametrize("base_url, provider", [
    ("https://myres.openai.azure.com/openai/v1/", sc.PROVIDER_AZURE_OPENAI),
    ("https://myres.cognitiveservices.azure.com/openai/v1/", sc.PROVIDER_AZURE_OPENAI),
    ("https://myproj.services.ai.azure.com/openai/v1/", sc.PROVIDER_AZURE_OPENAI),
    ("https://myproj.services.ai.azure.com/models", sc.PROVIDER_AZURE_AI_INFERENCE),
], ids=["openai resource", "ai services resource", "foundry openai", "foundry model inference"])
def test_azure_reached_with_the_plain_client_is_named(otel: Captured, base_url: str, provider: str) -> None:
    """Azure's v1 API takes the plain OpenAI client, pointed at the resource through base_url."""
    http, _ = wire.mock_client(openai_server(tokens=TOKENS, usage=USAGE))
    client = openai.OpenAI(api_key=API_KEY, base_url=base_url, http_client=http)
    client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    attrs = attributes(otel.span())
    assert attrs[sc.PROVIDER_NAME] == provider
    assert (attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT]) == (base_url.split("/")[2], 443)


def test_client_made_before_instrument_is_covered(instrument: object) -> None:
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    captured = instrument()  # type: ignore[operator]
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(captured.spans()) == 1


def test_transport_of_the_installed_client_is_httpx2() -> None:
    # the field note: openai 3.x runs on httpx2; the wire fakes must use the library it really imports
    assert wire.http_module() is httpx2
