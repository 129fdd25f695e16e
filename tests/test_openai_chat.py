"""Chat completions through the real openai client, sync and async, streamed and not: one span, whole metric points."""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import re
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest
import wire
import wrapt
from conftest import (
    Captured,
    Instrument,
    async_client,
    attributes,
    cancel_midway,
    openai_server,
    sync_client,
)
from openai._base_client import BaseClient
from opentelemetry.trace import SpanKind, StatusCode

from otel_llm import _safety
from otel_llm import _semconv as sc
from otel_llm._operation import Operation
from otel_llm.providers import openai as openai_adapter

TOKENS = ["Hel", "lo", " world"]
USAGE = wire.Usage(input=12, output=4, cached=4, reasoning=1)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]
PROMPT_CHARS = len("Be brief.") + len("Say hello")
# pauses on the wire: before the headers, then before each chunk (role-only, 3 tokens, finish, usage, [DONE])
HEADERS_DELAY = 0.02
DELAYS = [0.0, 0.03, 0.01, 0.01]


def chat(is_async: bool, replies: wire.ReplySource, **kwargs: Any) -> tuple[Any, wire.Recorder]:
    """Call chat.completions.create like an application would; a stream is read to its end."""
    if is_async:
        client, recorder = async_client(replies)

        async def go() -> Any:
            result = await client.chat.completions.create(**kwargs)
            return [chunk async for chunk in result] if kwargs.get("stream") else result

        return asyncio.run(go()), recorder
    sync, recorder = sync_client(replies)
    result = sync.chat.completions.create(**kwargs)
    return (list(result) if kwargs.get("stream") else result), recorder


def base_attributes() -> dict[str, Any]:
    return {
        sc.OPERATION_NAME: "chat",
        sc.PROVIDER_NAME: "openai",
        sc.REQUEST_MODEL: "gpt-4o-mini",
        sc.SERVER_ADDRESS: "api.openai.com",
        sc.SERVER_PORT: 443,
    }


@pytest.mark.usefixtures("steady_clock")
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_streamed_chat_is_one_span_with_latency_and_usage(otel: Captured, is_async: bool) -> None:
    server = openai_server(tokens=TOKENS, usage=USAGE, headers_delay=HEADERS_DELAY, delays=DELAYS)
    chunks, recorder = chat(is_async, server, model="gpt-4o-mini", messages=MESSAGES, stream=True,
                            temperature=0.2, max_tokens=50)

    # the caller sees the role chunk, three tokens and the finish chunk: not the usage chunk we asked for
    assert [c.choices[0].delta.content for c in chunks] == ["", "Hel", "lo", " world", None]
    assert recorder.requests[0].json["stream_options"] == {"include_usage": True}

    span = otel.span()
    assert span.name == "chat gpt-4o-mini"
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    attrs = dict(attributes(span))
    timings = {key: attrs.pop(key) for key in (sc.RESPONSE_TIME_TO_FIRST_CHUNK, sc.MAX_CHUNK_GAP,
                                                 sc.TIME_PER_OUTPUT_TOKEN, sc.TIME_TO_HEADERS)}
    assert attrs == {
        **base_attributes(),
        sc.OPENAI_API_TYPE: sc.OPENAI_API_CHAT_COMPLETIONS,  # on the span only: no metric series more
        sc.REQUEST_STREAM: True,
        sc.PROMPT_LENGTH: PROMPT_CHARS,
        sc.REQUEST_TEMPERATURE: 0.2,
        sc.REQUEST_MAX_TOKENS: 50,
        sc.RESPONSE_ID: "chatcmpl-abc",
        sc.RESPONSE_MODEL: wire.CHAT_MODEL,
        sc.OPENAI_RESPONSE_SERVICE_TIER: "default",  # from the first chunk
        sc.OPENAI_RESPONSE_SYSTEM_FINGERPRINT: wire.SYSTEM_FINGERPRINT,
        sc.RESPONSE_FINISH_REASONS: ("stop",),
        sc.USAGE_INPUT_TOKENS: 12,
        sc.USAGE_OUTPUT_TOKENS: 4,
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 4,
        sc.USAGE_REASONING_OUTPUT_TOKENS: 1,
        sc.CONTENT_CHUNKS: 3,
        sc.USAGE_INJECTED: True,
    }
    # first content = headers delay + role chunk + first token's pause; the role-only chunk is not a token
    assert 0.05 <= timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK] < 0.05 + 0.03
    assert 0.02 <= timings[sc.TIME_TO_HEADERS] < timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK]
    assert 0.01 <= timings[sc.MAX_CHUNK_GAP] < 0.02
    # two gaps of 10 ms spread over the two tokens after the first
    assert timings[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(0.01, abs=0.004)

    metric_attrs = {**base_attributes(), sc.RESPONSE_MODEL: wire.CHAT_MODEL}
    timing_attrs = {**metric_attrs, sc.REQUEST_STREAM: True, sc.PROMPT_SIZE: "<1k"}
    duration = otel.point(sc.STABLE_NAMES.duration.name)
    assert dict(duration.attributes) == timing_attrs
    assert duration.count == 1 and duration.sum >= timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK] + 0.02
    assert tuple(duration.explicit_bounds) == sc.LATENCY_BUCKETS
    ttfc = otel.point(sc.STABLE_NAMES.time_to_first_chunk.name)
    assert dict(ttfc.attributes) == timing_attrs
    assert ttfc.count == 1 and ttfc.sum == pytest.approx(timings[sc.RESPONSE_TIME_TO_FIRST_CHUNK], abs=1e-9)
    gaps = otel.point(sc.STABLE_NAMES.time_per_output_chunk.name)
    assert dict(gaps.attributes) == metric_attrs
    assert gaps.count == 2 and gaps.sum == pytest.approx(0.02, abs=0.006)
    assert tuple(gaps.explicit_bounds) == sc.CHUNK_BUCKETS
    tpot = otel.point(sc.STABLE_NAMES.time_per_output_token.name)
    assert tpot.count == 1 and tpot.sum == pytest.approx(timings[sc.TIME_PER_OUTPUT_TOKEN], abs=1e-9)
    usage_name = sc.STABLE_NAMES.token_usage.name  # type: ignore[union-attr]
    assert otel.point(usage_name, gen_ai__token__type="input").sum == 12
    assert otel.point(usage_name, gen_ai__token__type="output").sum == 4
    assert dict(otel.point(usage_name, gen_ai__token__type="output").attributes) == {
        **metric_attrs, sc.TOKEN_TYPE: "output"}
    prompt = otel.point(sc.STABLE_NAMES.prompt_length.name)
    assert (prompt.count, prompt.sum) == (1, PROMPT_CHARS)
    assert tuple(prompt.explicit_bounds) == sc.COUNT_BUCKETS


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_plain_chat_records_duration_and_usage_but_no_stream_metrics(otel: Captured, is_async: bool) -> None:
    server = openai_server(tokens=TOKENS, usage=USAGE)
    completion, recorder = chat(is_async, server, model="gpt-4o-mini", messages=MESSAGES, seed=7, stop="\n")

    assert completion.choices[0].message.content == "Hello world"
    assert "stream_options" not in recorder.requests[0].json
    span = otel.span()
    attrs = dict(attributes(span))
    assert attrs.pop(sc.TIME_TO_HEADERS) > 0
    assert attrs == {
        **base_attributes(),
        sc.OPENAI_API_TYPE: sc.OPENAI_API_CHAT_COMPLETIONS,
        sc.REQUEST_STREAM: False,
        sc.PROMPT_LENGTH: PROMPT_CHARS,
        sc.REQUEST_SEED: 7,
        sc.REQUEST_STOP_SEQUENCES: ("\n",),
        sc.RESPONSE_ID: "chatcmpl-abc",
        sc.RESPONSE_MODEL: wire.CHAT_MODEL,
        sc.OPENAI_RESPONSE_SERVICE_TIER: "default",  # how OpenAI served it, as the response says
        sc.OPENAI_RESPONSE_SYSTEM_FINGERPRINT: wire.SYSTEM_FINGERPRINT,
        sc.RESPONSE_FINISH_REASONS: ("stop",),
        sc.USAGE_INPUT_TOKENS: 12,
        sc.USAGE_OUTPUT_TOKENS: 4,
        sc.USAGE_CACHE_READ_INPUT_TOKENS: 4,
        sc.USAGE_REASONING_OUTPUT_TOKENS: 1,
    }
    metrics = otel.metrics()
    assert set(metrics) == {
        sc.STABLE_NAMES.duration.name, sc.STABLE_NAMES.token_usage.name,  # type: ignore[union-attr]
        sc.STABLE_NAMES.prompt_length.name,
    }
    duration = otel.point(sc.STABLE_NAMES.duration.name)
    assert dict(duration.attributes) == {**base_attributes(), sc.RESPONSE_MODEL: wire.CHAT_MODEL,
                                         sc.REQUEST_STREAM: False, sc.PROMPT_SIZE: "<1k"}
    start, end = span.start_time, span.end_time
    assert start is not None and end is not None
    assert duration.sum == pytest.approx((end - start) / 1e9, abs=1e-6)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_tool_call_deltas_are_content(otel: Captured, is_async: bool) -> None:
    events = wire.chat_stream(['{"city"', ': "Paris"}'], tool_call=True, usage=USAGE)
    chunks, _ = chat(is_async, [wire.Reply.stream(events, delays=[0.0, 0.02, 0.01])], model="gpt-4o-mini",
                     messages=MESSAGES, stream=True)

    assert len(chunks) == 4  # opening, two argument deltas, finish: the usage chunk stays hidden
    attrs = attributes(otel.span())
    # the opening chunk names the tool call: a tool-call delta is output, so it is the first chunk
    assert attrs[sc.CONTENT_CHUNKS] == 3
    assert attrs[sc.RESPONSE_FINISH_REASONS] == ("tool_calls",)


def test_latest_experimental_names_on_opt_in(instrument: Any) -> None:
    captured = instrument(OTEL_SEMCONV_STABILITY_OPT_IN="http,gen_ai_latest_experimental")
    chat(False, openai_server(tokens=TOKENS, usage=USAGE), model="gpt-4o-mini", messages=MESSAGES, stream=True)

    names = sc.LATEST_EXPERIMENTAL_NAMES
    metrics = captured.metrics()
    assert sc.STABLE_NAMES.duration.name not in metrics
    assert captured.point(names.duration.name).count == 1
    assert captured.point(names.time_to_first_chunk.name).count == 1
    assert captured.point(names.input_tokens.name).sum == 12  # type: ignore[union-attr]
    assert captured.point(names.output_tokens.name).sum == 4  # type: ignore[union-attr]
    # the usage counters, the parts of input and output among them: cache writes OpenAI does not report are 0
    counters = (names.input_token_counter, names.output_token_counter, names.cache_read_counter,
                names.cache_write_counter, names.reasoning_counter)
    assert [captured.point(counter.name).value for counter in counters if counter] == [12, 4, 4, 0, 1]
    # the names of the GenAI conventions repository (gen-ai-token-metrics.md), spelt out: a name of our own making
    # would pass the lines above
    assert {name for name in metrics if name.startswith("gen_ai.")} == {
        "gen_ai.client.inference.duration", "gen_ai.client.inference.time_to_first_chunk",
        "gen_ai.client.inference.time_per_output_chunk", "gen_ai.client.inference.operation.input_tokens",
        "gen_ai.client.inference.operation.output_tokens", "gen_ai.client.inference.usage.input_tokens",
        "gen_ai.client.inference.usage.output_tokens", "gen_ai.client.inference.usage.cache_read.input_tokens",
        "gen_ai.client.inference.usage.cache_write.input_tokens",
        "gen_ai.client.inference.usage.reasoning.output_tokens"}
    for counter in counters:  # its required modality, not split
        assert counter is not None and captured.point(counter.name).attributes[sc.TOKEN_MODALITY] == "unknown"


def test_the_newer_usage_counters_count_a_failed_operation_as_no_tokens(instrument: Any) -> None:
    """gen-ai-token-metrics.md: every inference operation adds to the usage counters, a failed one 0, so that a
    model's spend reads as a rate even while its every call fails."""
    captured = instrument(OTEL_SEMCONV_STABILITY_OPT_IN=sc.LATEST_EXPERIMENTAL_OPT_IN)
    client, _ = sync_client([wire.Reply.json(wire.error_body("Rate limit reached", type="requests"), status=429)])
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    names = sc.LATEST_EXPERIMENTAL_NAMES
    for counter in (names.input_token_counter, names.output_token_counter, names.cache_read_counter,
                    names.cache_write_counter, names.reasoning_counter):
        assert counter is not None
        point = captured.point(counter.name)
        assert (point.value, point.attributes[sc.ERROR_TYPE]) == (0, "RateLimitError"), counter.name
    assert captured.points(names.input_tokens.name) == []  # type: ignore[union-attr]  # no count to spread


def test_a_misspelt_genai_opt_in_is_named_and_the_stable_names_used(instrument: Any,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    captured = instrument(OTEL_SEMCONV_STABILITY_OPT_IN="http,gen_ai_latest_experimentl")
    chat(False, openai_server(tokens=TOKENS, usage=USAGE), model="gpt-4o-mini", messages=MESSAGES, stream=True)
    assert captured.point(sc.STABLE_NAMES.duration.name).count == 1
    assert [record.getMessage() for record in caplog.records if record.name == "otel_llm"] == [
        "otel_llm: ignoring gen_ai_latest_experimentl in OTEL_SEMCONV_STABILITY_OPT_IN="
        "'http,gen_ai_latest_experimentl' (the GenAI option is gen_ai_latest_experimental); using the stable names"]


@pytest.fixture
def built_by_client(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The JSON of every stream event the openai client turned into an object (sync and async clients alike)."""
    built: list[Any] = []
    original = BaseClient._process_response_data

    def spy(self: Any, *, data: Any, **kwargs: Any) -> Any:
        built.append(data)
        return original(self, data=data, **kwargs)

    monkeypatch.setattr(BaseClient, "_process_response_data", spy)
    return built


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_usage_chunk_we_asked_for_is_read_before_the_client_builds_it(
        otel: Captured, built_by_client: list[Any], is_async: bool) -> None:
    chunks, _ = chat(is_async, openai_server(tokens=TOKENS, usage=USAGE), model="gpt-4o-mini", messages=MESSAGES,
                     stream=True)

    assert len(chunks) == len(built_by_client) == 5  # role, three tokens, finish: the client built what it handed
    assert all(data["choices"] for data in built_by_client)
    attrs = attributes(otel.span())
    assert [attrs[key] for key in (sc.USAGE_INPUT_TOKENS, sc.USAGE_OUTPUT_TOKENS, sc.USAGE_CACHE_READ_INPUT_TOKENS,
                                   sc.USAGE_REASONING_OUTPUT_TOKENS)] == [12, 4, 4, 1]


def test_usage_chunk_with_no_finish_before_it_is_built_by_the_client_and_still_hidden(
        otel: Captured, built_by_client: list[Any]) -> None:
    # a compatible server that never sends a finish_reason: the usage chunk goes the client's way, the proxy hides it
    events = [event for event in wire.chat_stream(TOKENS, usage=USAGE) if b'"finish_reason":"stop"' not in event]
    chunks, _ = chat(False, [wire.Reply.stream(events)], model="gpt-4o-mini", messages=MESSAGES, stream=True)

    assert len(chunks) == 4 and all(chunk.choices for chunk in chunks)
    assert len(built_by_client) == 5
    attrs = attributes(otel.span())
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS]) == (12, 4)


def as_read(stream: Any) -> list[tuple[str, Any]]:
    """Each chunk a caller reads, as JSON of the fields it was given, and its usage."""
    return [(chunk.model_dump_json(warnings=False, exclude_unset=True), chunk.usage) for chunk in stream]


MODERATION = {"input": {"type": "moderation_results", "model": "omni-moderation-latest", "results": []},
              "output": {"type": "moderation_results", "model": "omni-moderation-latest", "results": []}}


def moderated_server(finishes: bool) -> Callable[[wire.RecordedRequest], wire.Reply]:
    """A server that puts its moderation result on the last chunk without choices: the usage chunk, when asked for
    usage; a chunk of its own otherwise. ``finishes``: a finish_reason comes before it."""

    def answer(request: wire.RecordedRequest) -> wire.Reply:
        asked = (request.json.get("stream_options") or {}).get("include_usage") is True
        *events, usage_event, done = wire.chat_stream(TOKENS, usage=USAGE)
        usage_chunk = json.loads(usage_event[len(b"data: "):])
        if not asked:
            events = wire.chat_stream(TOKENS)[:-1]
            del usage_chunk["usage"]
        if not finishes:
            events = [event for event in events if b'"finish_reason":"stop"' not in event]
        return wire.Reply.stream([*events, wire.sse({**usage_chunk, "moderation": MODERATION}), done])

    return answer


@pytest.mark.parametrize("finishes", [True, False], ids=["read before the client builds it", "no finish before it"])
def test_a_usage_chunk_that_carries_a_moderation_result_reaches_the_caller_as_it_comes_unasked(
        instrument: Instrument, finishes: bool) -> None:
    def read() -> list[tuple[str, Any]]:
        client, _ = sync_client(moderated_server(finishes))
        return as_read(client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True))

    without = read()
    otel = instrument()
    assert read() == without
    assert '"moderation":' in without[-1][0] and [usage for _, usage in without] == [None] * len(without)
    attrs = attributes(otel.span())
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS]) == (12, 4)


def usage_on_every_chunk(legacy: bool) -> Callable[[wire.RecordedRequest], wire.Reply]:
    """vLLM asked for ``stream_options.continuous_usage_stats``: once usage is asked for too, every chunk carries the
    counts so far, then the usage chunk; otherwise none does."""

    def answer(request: wire.RecordedRequest) -> wire.Reply:
        options = request.json.get("stream_options") or {}
        asked = options.get("include_usage") is True
        if asked and not options.get("continuous_usage_stats"):
            return wire.Reply.stream(wire.completion_stream(TOKENS, usage=USAGE) if legacy
                                     else wire.chat_stream(TOKENS, usage=USAGE))
        usage = USAGE if asked else None
        events = wire.completion_stream(TOKENS, usage=usage) if legacy else wire.chat_stream(TOKENS, usage=usage)
        if not asked:
            return wire.Reply.stream(events)
        *chunks, usage_event, done = events
        counts = json.loads(usage_event[len(b"data: "):])["usage"]
        so_far = [json.loads(event[len(b"data: "):]) for event in chunks]
        for n, data in enumerate(so_far):
            data["usage"] = {**counts, "completion_tokens": n, "total_tokens": counts["prompt_tokens"] + n}
        return wire.Reply.stream([*(wire.sse(data) for data in so_far), usage_event, done])

    return answer


@pytest.mark.parametrize("legacy", [False, True], ids=["chat", "legacy completions"])
def test_vllms_continuous_usage_reaches_the_caller_only_if_it_asked_for_usage(instrument: Instrument,
                                                                              legacy: bool) -> None:
    """The caller asks for continuous_usage_stats alone, which vLLM honours only with include_usage: the counts our
    include_usage brings on every chunk are taken off, and read."""
    def read() -> list[tuple[str, Any]]:
        client, _ = sync_client(usage_on_every_chunk(legacy))
        continuous = {"extra_body": {"stream_options": {"continuous_usage_stats": True}}}
        if legacy:
            stream = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hello", stream=True,
                                               **continuous)
        else:
            stream = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True,
                                                    **continuous)
        return as_read(stream)

    without = read()
    otel = instrument()
    assert read() == without
    assert [usage for _, usage in without] == [None] * len(without)
    attrs = attributes(otel.span())
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS]) == (12, 4)


@pytest.mark.parametrize("call", ["chat", "chat, streamed", "responses", "responses, streamed"])
def test_tokens_written_to_the_prompt_cache_are_counted_apart_and_in_the_input(otel: Captured, call: str) -> None:
    usage = wire.Usage(input=12, output=4, cached=4, cache_write=6)
    if call.startswith("chat"):
        client, _ = sync_client(openai_server(tokens=TOKENS, usage=usage))
        result = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=call.endswith("ed"))
    else:
        streamed = call.endswith("ed")
        client, _ = sync_client([wire.Reply.stream(wire.responses_stream(TOKENS, usage=usage)) if streamed
                                 else wire.Reply.json(wire.response_body("".join(TOKENS), usage=usage))])
        result = client.responses.create(model="gpt-4.1", input="hello", stream=streamed)
    if isinstance(result, openai.Stream):
        list(result)
    attrs = attributes(otel.span())
    assert [attrs[key] for key in (sc.USAGE_INPUT_TOKENS, sc.USAGE_CACHE_READ_INPUT_TOKENS,
                                   sc.USAGE_CACHE_CREATION_INPUT_TOKENS)] == [12, 4, 6]
    assert otel.point("gen_ai.client.token.usage", gen_ai__token__type="input").sum == 12


@pytest.mark.parametrize("stream", [1, "yes"])
def test_a_stream_asked_for_with_another_true_value_is_a_stream(otel: Captured, stream: object) -> None:
    client, _ = sync_client(openai_server(tokens=TOKENS, usage=USAGE))
    chunks = list(client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=stream))  # type: ignore[call-overload]
    assert len(chunks) == 5 and all(chunk.choices for chunk in chunks)  # streamed as the client decides, ours hidden
    attrs = attributes(otel.span())
    assert attrs[sc.REQUEST_STREAM] is True and attrs[sc.USAGE_OUTPUT_TOKENS] == 4
    assert attrs[sc.CONTENT_CHUNKS] == 3 and sc.RESPONSE_TIME_TO_FIRST_CHUNK in attrs


def two_choices_stream(reasons: tuple[str, str] = ("stop", "stop"), first: int = 0) -> list[bytes]:
    """n=2: choice ``first`` finishes while the other still streams, then the usage chunk; each choice finishes with
    its reason in ``reasons``."""
    one, finished_one, two, finished_two, usage_and_done = [], [], [], [], []
    for index, target in ((first, one), (1 - first, two)):
        choice_events = wire.chat_stream([f"t{index}"], usage=USAGE, finish_reason=reasons[index])
        body = [json.loads(event[len(b"data: "):]) for event in choice_events[:-2]]
        for data in body:
            data["choices"][0]["index"] = index
        *content, finish = body
        target.extend(wire.sse(data) for data in content)
        (finished_one if index == first else finished_two).append(wire.sse(finish))
        usage_and_done[:] = choice_events[-2:]
    return [*one, *finished_one, *two, *finished_two, *usage_and_done]


def test_chunks_after_the_first_finished_choice_reach_the_caller_unchanged(instrument: Any) -> None:
    def read_all(events: list[bytes]) -> list[str]:
        client, _ = sync_client([wire.Reply.stream(events)])
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True, n=2)
        return [chunk.model_dump_json(exclude_unset=True) for chunk in stream]

    without = read_all(wire.unasked(two_choices_stream()))
    captured = instrument()
    assert read_all(two_choices_stream()) == without  # the server asked for usage by us
    attrs = attributes(captured.span())
    assert attrs[sc.RESPONSE_FINISH_REASONS] == ("stop", "stop")
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS], attrs[sc.CONTENT_CHUNKS]) == (12, 4, 2)


def test_a_streams_finish_reasons_are_in_the_order_of_its_choices(otel: Captured) -> None:
    """Choice 1 finishes first, cut at the length limit, then choice 0: the finish reasons are in the order of the
    choices, as a whole completion lists them, so that each is its output message's."""
    client, _ = sync_client([wire.Reply.stream(two_choices_stream(("stop", "length"), first=1))])
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True, n=2))
    assert attributes(otel.span())[sc.RESPONSE_FINISH_REASONS] == ("stop", "length")


@pytest.mark.parametrize("read, outcome", [(3, sc.ERROR_CANCELLED), (6, None)],
                         ids=["one of two choices finished", "both finished"])
def test_a_caller_that_stops_once_every_choice_finished_has_not_cancelled(
        otel: Captured, read: int, outcome: str | None) -> None:
    client, _ = sync_client([wire.Reply.stream(two_choices_stream())])
    with client.chat.completions.create(model="m", messages=MESSAGES, stream=True, n=2) as stream:
        chunks = [chunk for _, chunk in zip(range(read), stream, strict=False)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    otel.assert_finished(outcome)


def test_choices_asked_for_in_extra_body_count_too(otel: Captured) -> None:
    client, _ = sync_client([wire.Reply.stream(two_choices_stream())])
    with client.chat.completions.create(model="m", messages=MESSAGES, stream=True, extra_body={"n": 2}) as stream:
        chunks = [chunk for _, chunk in zip(range(3), stream, strict=False)]  # choice 0 finished, not choice 1
    assert chunks[-1].choices[0].finish_reason == "stop"
    otel.assert_finished(sc.ERROR_CANCELLED)


def test_a_finish_said_again_or_output_after_it_is_no_completion(otel: Captured) -> None:
    """A server that repeats a finish reason, or sends output after it: the response was not complete then."""
    *content, finish, usage, done = wire.chat_stream(TOKENS, usage=USAGE)
    events = [*content[:2], finish, finish, content[2], *content[2:], finish, usage, done]
    client, _ = sync_client([wire.Reply.stream(events)])
    with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
        chunks = [chunk for _, chunk in zip(range(5), stream, strict=False)]  # read on past the finishes
    assert chunks[-1].choices[0].delta.content == TOKENS[1]
    otel.assert_finished(sc.ERROR_CANCELLED)


def test_a_task_cancelled_awaiting_the_tail_of_a_complete_response_cancelled_nothing(otel: Captured) -> None:
    *content, finish, usage, done = wire.chat_stream(TOKENS, usage=USAGE)
    client, _ = async_client([wire.Reply.stream([*content, finish, usage, done], delays=[0] * 5 + [1.0])])

    async def consume() -> None:
        async for _ in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            pass  # cancelled while the usage chunk is a second away

    cancel_midway(consume)
    otel.assert_finished(None)
    assert attributes(otel.span())[sc.CONTENT_CHUNKS] == 3


def audio_stream() -> list[bytes]:
    """modalities=["text", "audio"]: the output comes as transcript and data in delta.audio, content stays null."""
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return wire.sse(wire._chat_chunk("chatcmpl-a", "gpt-4o-audio-preview", [choice], {"usage": None}))

    return [chunk({"role": "assistant", "content": None}), chunk({"audio": {"id": "audio_1", "transcript": "Hel"}}),
            chunk({"audio": {"data": "UklGRg=="}}), chunk({"audio": {"transcript": "lo", "data": "AAAA"}}),
            chunk({"audio": {"expires_at": 1735689999}}, "stop"), wire.DONE]


def test_audio_deltas_are_output(otel: Captured) -> None:
    reply = wire.Reply.stream(audio_stream(), delays=[0, 0.03, 0.01, 0.01, 0, 0])
    chunks, _ = chat(False, [reply], model="gpt-4o-audio-preview", messages=MESSAGES, stream=True,
                     modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"})
    assert len(chunks) == 5
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == 3
    assert 0.03 <= attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] < 0.03 + 0.02


def test_a_choice_without_a_delta_is_read_as_its_finish(otel: Captured) -> None:
    """Some compatible servers finish with ``"delta": null``, and Azure's content-filter annotations carry no delta:
    the finish reason is still the response's, and the caller stopping there cancelled nothing."""
    def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return wire.sse(wire._chat_chunk("chatcmpl-a", "gpt-4o-mini", [choice], {"usage": None}))

    reply = wire.Reply.stream([chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}),
                               chunk({"content": "lo"}), chunk(None, "stop"), chunk(None), wire.DONE])
    seen = []

    def read_to_the_finish(client: Any) -> None:
        with client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": False}) as stream:
            for item in stream:
                seen.append(item.choices[0].finish_reason)
                if item.choices[0].finish_reason:
                    break

    with wire.LoopbackServer([reply]) as server:
        read_to_the_finish(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    assert seen == [None, None, None, "stop"]
    otel.assert_finished(None)
    attrs = attributes(otel.span())
    assert (attrs[sc.RESPONSE_FINISH_REASONS], attrs[sc.CONTENT_CHUNKS]) == (("stop",), 2)


@pytest.mark.parametrize("streamed_reasoning", [False, True], ids=["hidden reasoning", "streamed reasoning"])
@pytest.mark.timing  # TPOT from pauses of 10-20 ms, within 4 ms
def test_time_per_output_token_counts_the_tokens_that_were_streamed(otel: Captured, streamed_reasoning: bool) -> None:
    """OpenAI's reasoning models count reasoning tokens they never stream in the output tokens; compatible servers
    that stream the reasoning text (reasoning_content) count the tokens they streamed."""
    usage = wire.Usage(input=10, output=1005 if not streamed_reasoning else 5, reasoning=1000 if not
                       streamed_reasoning else 2)
    events = wire.chat_stream(["a", "b", "c", "d", "e"], usage=usage)
    if streamed_reasoning:  # the first two deltas are reasoning text
        events[1:3] = [event.replace(b'"content":', b'"reasoning_content":') for event in events[1:3]]
    reply = wire.Reply.stream(events, delays=[0, 0, 0.01, 0.01, 0.01, 0.01])
    chat(False, [reply], model="o4-mini", messages=MESSAGES, stream=True)
    # four gaps of 10 ms between five streamed tokens: 10 ms per token after the first
    assert attributes(otel.span())[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(0.01, abs=0.004)


def test_an_answer_in_one_chunk_has_no_time_per_output_token(otel: Captured) -> None:
    """Five tokens in one chunk: how they were spread in time cannot be seen, which is not a spread of 0 s (a
    record of 0 would pull the TPOT percentiles down with every short answer)."""
    chat(False, [wire.Reply.stream(wire.chat_stream(["Yes, it is."], usage=wire.Usage(input=9, output=5)))],
         model="gpt-4o-mini", messages=MESSAGES, stream=True)
    attrs = attributes(otel.span())
    assert attrs[sc.CONTENT_CHUNKS] == 1 and attrs[sc.USAGE_OUTPUT_TOKENS] == 5
    assert sc.TIME_PER_OUTPUT_TOKEN not in attrs
    assert otel.points(sc.STABLE_NAMES.time_per_output_token.name) == []


@pytest.mark.parametrize("usage", ['"n/a"', "[1,2]", '{"prompt_tokens":"12","completion_tokens":null}',
                                   '{"prompt_tokens":-12,"completion_tokens":1.5}',
                                   # past a trillion: garbage, and sums of it could pass what OTLP's int64 holds
                                   '{"prompt_tokens":1e19,"completion_tokens":1000000000001}'])
def test_usage_chunk_we_asked_for_with_odd_usage_is_still_hidden_and_records_no_counts(
        otel: Captured, usage: str, caplog: pytest.LogCaptureFixture) -> None:
    events = wire.chat_stream(TOKENS, usage=USAGE)
    events[-2] = re.sub(rb'"usage":\{.*\}\}', b'"usage":' + usage.encode(), events[-2])
    chunks, _ = chat(False, [wire.Reply.stream(events)], model="gpt-4o-mini", messages=MESSAGES, stream=True)

    assert len(chunks) == 5 and all(chunk.choices for chunk in chunks)
    attrs = attributes(otel.span())
    assert sc.USAGE_INPUT_TOKENS not in attrs and sc.USAGE_OUTPUT_TOKENS not in attrs
    assert otel.points(sc.STABLE_NAMES.token_usage.name) == []  # type: ignore[union-attr]
    assert not caplog.records


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("write_size", [7, 100_000], ids=["7-byte writes", "one write"])
def test_usage_chunk_is_read_however_the_bytes_are_cut(instrument: Any, built_by_client: list[Any],
                                                     newline: bytes, write_size: int) -> None:
    body = b"".join(wire.chat_stream(TOKENS, usage=USAGE)).replace(b"\n", newline)

    unasked = b"".join(wire.unasked(wire.chat_stream(TOKENS, usage=USAGE))).replace(b"\n", newline)

    def read_all(body: bytes) -> list[str]:
        writes = [body[start:start + write_size] for start in range(0, len(body), write_size)]
        client, _ = sync_client([wire.Reply.stream(writes)])
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        return [chunk.model_dump_json(exclude_unset=True) for chunk in stream]

    without = read_all(unasked)  # what the client makes of the bytes a server sends unasked
    captured = instrument()
    built_by_client.clear()
    assert read_all(body) == without
    assert all(data["choices"] for data in built_by_client)
    attrs = attributes(captured.span())
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS]) == (12, 4)


def usage_on_the_finishing_chunk() -> list[bytes]:
    """A compatible server's way: usage on the chunk with finish_reason, no usage chunk of its own."""
    *content, finish, usage, done = wire.chat_stream(TOKENS, usage=USAGE)
    finish_data = json.loads(finish.removeprefix(b"data: "))
    finish_data["usage"] = json.loads(usage.removeprefix(b"data: "))["usage"]
    return [*content, wire.sse(finish_data), done]


def usage_on_output_chunks(where: str, always: bool) -> Callable[[wire.RecordedRequest], wire.Reply]:
    """A compatible server that puts usage on chunks of output (``where``: the finishing chunk, or every chunk with
    the counts so far), and no usage chunk of its own: asked or not (``always``: llama-cpp-python's server puts it on
    the finishing chunk, llama.cpp's may on every chunk), or only when asked."""
    def answer(request: wire.RecordedRequest) -> wire.Reply:
        *chunks, done = wire.unasked(wire.chat_stream(TOKENS))
        asked = (request.json.get("stream_options") or {}).get("include_usage") is True
        if not (asked or always):
            return wire.Reply.stream([*chunks, done])
        counted = []
        for n, event in enumerate(chunks, start=1):
            data = json.loads(event.removeprefix(b"data: "))
            if where == "every" or n == len(chunks):
                output = USAGE.output if n == len(chunks) else n - 1  # the counts so far, then the whole answer's
                data["usage"] = {"prompt_tokens": USAGE.input, "completion_tokens": output,
                                 "total_tokens": USAGE.input + output}
            counted.append(wire.sse(data))
        return wire.Reply.stream([*counted, done])

    return answer


@pytest.mark.parametrize("always", [True, False], ids=["asked or not", "only when asked"])
@pytest.mark.parametrize("where", ["finishing", "every"], ids=["on the finishing chunk", "on every chunk"])
def test_usage_a_server_puts_on_chunks_of_output_is_read_and_left_where_it_is(
        instrument: Any, where: str, always: bool) -> None:
    """We cannot tell counts a server puts on chunks of output because we asked from counts it puts there anyway:
    we read them, and leave them to the caller, which never loses counts it would have had. A server that sends
    them only when asked shows them to the caller too; every other field of every chunk is as it comes unasked."""
    def read_all() -> list[Any]:
        client, _ = sync_client(usage_on_output_chunks(where, always))
        return [chunk.to_dict() for chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True)]

    without = read_all()
    otel = instrument()
    seen = read_all()
    if always:
        assert seen == without and all("usage" in chunk for chunk in without[-1 if where == "finishing" else 0:])
    else:
        assert all("usage" not in chunk for chunk in without)
        assert [{key: value for key, value in chunk.items() if key != "usage"} for chunk in seen] == without
        assert seen[-1]["usage"]["completion_tokens"] == 4
    attrs = attributes(otel.span())
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS], attrs[sc.USAGE_INJECTED]) == (12, 4, True)


@pytest.mark.parametrize("events, read, outcome", [
    (usage_on_the_finishing_chunk(), None, None),
    (wire.chat_stream(TOKENS), None, None),  # a server that ignored include_usage
    (wire.chat_stream(TOKENS, usage=USAGE), 5, None),  # the caller stops at the finish chunk: complete
], ids=["usage on the finishing chunk", "no usage", "caller stopped"])
def test_a_stream_whose_usage_chunk_never_comes_keeps_nothing_alive(
        otel: Captured, events: list[bytes], read: int | None, outcome: str | None) -> None:
    gc.collect()
    gc.disable()  # what is let go must be freed at once: a reference cycle would wait for the collector
    try:
        before = sum(1 for o in gc.get_objects() if type(o) is Operation)
        client, _ = sync_client([wire.Reply.stream(events)])
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        chunks = list(stream) if read is None else [chunk for _, chunk in zip(range(read), stream, strict=False)]
        stream.close()
        del stream, client
        otel.spans()  # written: under a batch span processor, what waits to be written is held until then
        assert sum(1 for o in gc.get_objects() if type(o) is Operation) == before
    finally:
        gc.enable()
    assert chunks[-1].choices[0].finish_reason == "stop"
    otel.assert_finished(outcome)


def refusing_server(refusal: str, delay: float = 0.0) -> wire.ReplySource:
    """A server that answers 400 to any request with stream_options (as Azure OpenAI before api-version
    2024-09-01-preview does), with ``refusal`` as the message, after ``delay``."""
    def answer(request: wire.RecordedRequest) -> wire.Reply:
        if "stream_options" in request.json:
            return wire.Reply.json(wire.error_body(refusal), status=400, headers_delay=delay)
        return wire.Reply.stream(wire.chat_stream(TOKENS))

    return answer


def validating_server(rejects: str) -> wire.ReplySource:
    """A FastAPI-style server (vLLM, gateways) whose 422 locates what it rejects and echoes the request body."""
    def answer(request: wire.RecordedRequest) -> wire.Reply:
        if rejects in request.json:
            detail = [{"type": "extra_forbidden", "loc": ["body", rejects], "msg": "Extra inputs are not permitted",
                       "input": request.json}]
            return wire.Reply.json({"detail": detail}, status=422)
        asked = (request.json.get("stream_options") or {}).get("include_usage") is True
        return wire.Reply.stream(wire.chat_stream(TOKENS, usage=USAGE if asked else None))

    return answer


REFUSALS = {
    "Azure's 400": refusing_server("Unrecognized request argument supplied: stream_options"),
    "a validation 422": validating_server("stream_options"),
}


@pytest.mark.parametrize("refusing", REFUSALS.values(), ids=REFUSALS)
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_server_that_refuses_stream_options_gets_the_callers_own_request(
        instrument: Any, monkeypatch: pytest.MonkeyPatch, is_async: bool, refusing: wire.ReplySource) -> None:
    monkeypatch.setattr(openai_adapter, "_NO_STREAM_OPTIONS", set())
    without_us, _ = chat(is_async, refusing, model="m", messages=MESSAGES, stream=True)
    captured = instrument()
    asked = []
    for _ in range(2):
        chunks, recorder = chat(is_async, refusing, model="m", messages=MESSAGES, stream=True)
        assert [chunk.to_json() for chunk in chunks] == [chunk.to_json() for chunk in without_us]
        asked.append(["stream_options" in request.json for request in recorder.requests])
    # the first call asked, was refused and went out again as the caller made it; the server is remembered
    assert asked == [[True, False], [False]]
    assert [attributes(span).get(sc.ERROR_TYPE) for span in captured.spans()] == [None, None]
    assert all(sc.USAGE_INJECTED not in attributes(span) for span in captured.spans())


def test_a_refusal_that_only_echoes_the_request_is_not_about_stream_options(
        otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 422 echoes the whole body, stream_options included, but locates something else: the caller's error,
    sent once, and the server is asked for usage the next time as before."""
    monkeypatch.setattr(openai_adapter, "_NO_STREAM_OPTIONS", set())
    client, recorder = sync_client(validating_server("logit_bias"))
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="m", messages=MESSAGES, stream=True, logit_bias={"1": 5})
    assert len(recorder.requests) == 1
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert "stream_options" in recorder.requests[-1].json


@pytest.mark.parametrize("iterables", ["messages", "tools", "content parts", "prediction parts"])
def test_iterators_the_caller_passes_reach_the_server_whatever_it_refuses(
        instrument: Any, monkeypatch: pytest.MonkeyPatch, iterables: str) -> None:
    """A refused request's iterators were used up sending it: an iterator argument is not asked for usage at all,
    and a resend takes the messages as the client sent them."""
    monkeypatch.setattr(openai_adapter, "_NO_STREAM_OPTIONS", set())
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": " 2+2?"}]

    def call(client: Any) -> list[Any]:
        kwargs: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": parts}]}
        if iterables == "messages":
            kwargs["messages"] = (message for message in kwargs["messages"])
        elif iterables == "tools":
            kwargs["tools"] = (tool for tool in tools)
        elif iterables == "content parts":
            kwargs["messages"] = [{"role": "user", "content": (part for part in parts)}]
        else:
            kwargs["prediction"] = {"type": "content", "content": (part for part in parts)}
        return list(client.chat.completions.create(**kwargs))

    refusing = refusing_server("Unrecognized request argument supplied: stream_options")
    client, bare = sync_client(refusing)
    call(client)
    otel = instrument()
    client, recorder = sync_client(refusing)
    assert len(call(client)) == 5
    assert recorder.requests[-1].json == bare.requests[-1].json
    otel.assert_finished(None)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_prompt_length_of_messages_from_a_generator_is_the_sent_bodys(otel: Captured, is_async: bool,
                                                                       stream: bool) -> None:
    """Content capture off: the length alone, read from the request as sent (tests/test_content.py has the rest)."""
    chat(is_async, openai_server(tokens=TOKENS, usage=USAGE), model="gpt-4o-mini", stream=stream,
         messages=(message for message in MESSAGES))
    assert attributes(otel.span())[sc.PROMPT_LENGTH] == PROMPT_CHARS
    assert otel.point(sc.STABLE_NAMES.prompt_length.name).sum == PROMPT_CHARS


def compressing_client() -> tuple[openai.OpenAI, wire.Recorder]:
    """A client that gzips its request bodies, to a server that refuses stream_options."""
    http = wire.http_module()

    def answer(request: wire.RecordedRequest) -> wire.Reply:
        if "stream_options" in json.loads(gzip.decompress(request.body)):
            return wire.Reply.json(wire.error_body("Unrecognized request argument supplied: stream_options"),
                                   status=400)
        return wire.Reply.stream(wire.chat_stream(TOKENS))

    class Compressing(http.Client):  # type: ignore[misc, name-defined]
        def send(self, request: Any, **kwargs: Any) -> Any:
            body = gzip.compress(request.read())
            headers = {**request.headers, "content-encoding": "gzip", "content-length": str(len(body))}
            return super().send(http.Request(request.method, request.url, headers=headers, content=body), **kwargs)

    recorder = wire.Recorder(answer)
    client = openai.OpenAI(api_key="k", base_url="https://api.openai.com/v1", max_retries=0,
                           http_client=Compressing(transport=http.MockTransport(wire._InProcessServer(recorder).handle)))
    return client, recorder


def test_a_refusal_of_a_body_we_cannot_read_back_sends_the_callers_arguments(
        otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that compresses its request bodies: the refused body is not JSON to us."""
    monkeypatch.setattr(openai_adapter, "_NO_STREAM_OPTIONS", set())
    client, _ = compressing_client()
    assert len(list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))) == 5
    otel.assert_finished(None)


@pytest.mark.parametrize("client_kind", ["openai", "azure"])
def test_a_resend_keeps_what_is_not_the_body_and_what_extra_body_overrode(
        instrument: Any, monkeypatch: pytest.MonkeyPatch, client_kind: str) -> None:
    """timeout is no body field, though a gateway may take one in extra_body; Azure builds the deployment URL from
    the model argument, which extra_body may override in the body."""
    monkeypatch.setattr(openai_adapter, "_NO_STREAM_OPTIONS", set())

    def send() -> tuple[str, str | None]:
        http, recorder = wire.mock_client(refusing_server("Unrecognized request argument supplied: stream_options"))
        if client_kind == "azure":
            client: Any = openai.AzureOpenAI(api_key="k", azure_endpoint="https://res.openai.azure.com",
                                             api_version="2023-05-15", http_client=http, max_retries=0)
        else:
            client = openai.OpenAI(api_key="k", http_client=http, max_retries=0)
        list(client.chat.completions.create(model="dep", messages=MESSAGES, stream=True, timeout=3.0,
                                            extra_body={"timeout": 600, "model": "gpt-4o"}))
        last = recorder.requests[-1]
        return last.path, last.headers.get("x-stainless-read-timeout")

    bare = send()
    instrument()
    assert send() == bare


def test_a_refused_body_we_cannot_read_back_with_used_up_iterators_is_the_refusal(
        otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing could send the caller's request again as it was: its error, rather than a different request."""
    monkeypatch.setattr(openai_adapter, "_NO_STREAM_OPTIONS", set())
    client, recorder = compressing_client()
    parts = [{"type": "text", "text": "What is 2+2?"}]
    with pytest.raises(openai.BadRequestError):
        list(client.chat.completions.create(model="m", stream=True,
                                            messages=[{"role": "user", "content": (p for p in parts)}]))
    assert len(recorder.requests) == 1


def test_time_to_first_chunk_is_the_answered_requests_after_a_refusal(
        otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_adapter, "_NO_STREAM_OPTIONS", set())
    client, _ = sync_client(refusing_server("Unrecognized request argument supplied: stream_options", delay=0.3))
    list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    span = otel.span()
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 >= 0.3  # the span covers the refused request too
    assert attributes(span)[sc.RESPONSE_TIME_TO_FIRST_CHUNK] < 0.2
    assert otel.point(sc.STABLE_NAMES.duration.name).sum < 0.2


def test_a_refusal_of_something_else_is_the_callers_error(otel: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_adapter, "_NO_STREAM_OPTIONS", set())
    client, recorder = sync_client(refusing_server("Unknown model: m"))
    with pytest.raises(openai.BadRequestError, match="Unknown model") as raised:
        client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert isinstance(raised.value.__context__, httpx2.HTTPStatusError)  # the client's own chaining, no more
    assert len(recorder.requests) == 1
    otel.assert_finished("BadRequestError")


def test_an_error_on_the_usage_chunk_is_still_raised_by_the_client(instrument: Any) -> None:
    *content, usage, done = wire.chat_stream(TOKENS, usage=USAGE)
    failed = json.loads(usage.removeprefix(b"data: "))
    failed["error"] = {"message": "upstream failed after the output", "type": "server_error"}
    events = [*content, wire.sse(failed), done]

    def read_all(**kwargs: Any) -> str:
        client, _ = sync_client([wire.Reply.stream(events)])
        with pytest.raises(openai.APIError) as raised:
            list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True, **kwargs))
        return raised.value.message

    without_us = read_all(stream_options={"include_usage": True})
    captured = instrument()
    assert read_all() == without_us  # the usage chunk is ours now, and its error the caller's all the same
    assert attributes(captured.span())[sc.ERROR_TYPE] == "APIError"


def test_counts_written_as_whole_floats_are_counts(otel: Captured) -> None:
    events = wire.chat_stream(TOKENS, usage=USAGE)
    events[-2] = re.sub(rb'"usage":\{.*\}\}', b'"usage":{"prompt_tokens":12.0,"completion_tokens":3.0}', events[-2])
    chat(False, [wire.Reply.stream(events)], model="gpt-4o-mini", messages=MESSAGES, stream=True)
    attrs = attributes(otel.span())
    assert (attrs[sc.USAGE_INPUT_TOKENS], attrs[sc.USAGE_OUTPUT_TOKENS]) == (12, 3)
    assert type(attrs[sc.USAGE_INPUT_TOKENS]) is int


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_an_id_and_model_that_are_not_text_are_left_out_and_the_metrics_kept(otel: Captured, stream: bool) -> None:
    """The client hands on whatever a server put in ``id`` and ``model``; as a metric attribute a list would cost
    the call every point."""
    if stream:
        events = wire.chat_stream(TOKENS, usage=USAGE)
        events[0] = events[0].replace(b'"id":"chatcmpl-abc"', b'"id":7').replace(b'"model":"gpt-4o-mini-2024-07-18"',
                                                                                b'"model":["m"]')
        reply = wire.Reply.stream(events)
    else:
        reply = wire.Reply.json({**wire.chat_completion_body("hi", usage=USAGE), "id": 7, "model": ["m"]})
    chat(False, [reply], model="gpt-4o-mini", messages=MESSAGES, stream=stream)
    attrs = attributes(otel.span())
    assert sc.RESPONSE_ID not in attrs and sc.RESPONSE_MODEL not in attrs
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == USAGE.output
    duration = otel.point(sc.STABLE_NAMES.duration.name)
    assert duration.count == 1 and sc.RESPONSE_MODEL not in duration.attributes


def _helper_events(client: Any) -> list[str]:
    with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
        events = [event.type for event in stream]
        return [*events, stream.get_final_completion().model_dump_json(exclude_unset=True)]


def _streaming_response(client: Any) -> list[str]:
    with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES, stream=True) as raw:
        return [chunk.model_dump_json(exclude_unset=True) for chunk in raw.parse()]


READ_PATHS = {
    "create": lambda client: [chunk.model_dump_json(exclude_unset=True) for chunk in client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True)],
    "stream() helper": _helper_events,
    "with_raw_response": lambda client: [chunk.model_dump_json(exclude_unset=True) for chunk in client.chat.completions
                                         .with_raw_response.create(model="m", messages=MESSAGES, stream=True).parse()],
    "with_streaming_response": _streaming_response,
}


@pytest.mark.parametrize("read", READ_PATHS.values(), ids=READ_PATHS.keys())
def test_every_way_of_reading_a_stream_gets_what_it_gets_without_us_and_usage_is_lifted(
        instrument: Any, built_by_client: list[Any], read: Any) -> None:
    """Usage is asked for and lifted out of the stream, except through a raw response: its caller may read the
    SSE lines, where nothing could take our chunk out (tests/test_openai_variants.py)."""
    without = read(sync_client(openai_server(tokens=TOKENS, usage=USAGE))[0])
    captured = instrument()
    built_by_client.clear()
    assert read(sync_client(openai_server(tokens=TOKENS, usage=USAGE))[0]) == without
    assert all(data["choices"] for data in built_by_client)
    attrs = attributes(captured.span())
    asked = read not in (READ_PATHS["with_raw_response"], READ_PATHS["with_streaming_response"])
    assert (attrs.get(sc.USAGE_INPUT_TOKENS), attrs.get(sc.USAGE_OUTPUT_TOKENS)) == ((12, 4) if asked else
                                                                                       (None, None))


class OtherLibrarysStream:
    """Shaped like OpenTelemetry openai-v2's stream wrapper: a plain object (no proxy, so not an openai.Stream) that
    iterates the client's stream and passes every other attribute through."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __iter__(self) -> OtherLibrarysStream:
        return self

    def __next__(self) -> Any:
        return next(self.stream)

    def __aiter__(self) -> OtherLibrarysStream:
        return self

    async def __anext__(self) -> Any:
        return await self.stream.__anext__()

    def close(self) -> Any:
        return self.stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class IterableOnlyStream:
    """Another library's wrapper written as a generator method: iterable, not an iterator."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __iter__(self) -> Any:
        yield from self.stream

    def close(self) -> None:
        self.stream.close()


class AsyncIterableOnlyStream:
    def __init__(self, stream: Any) -> None:
        self.stream = stream

    async def __aiter__(self) -> Any:
        async for chunk in self.stream:
            yield chunk


# how another library may hand the client's stream back: (stream, is_async) -> its object
FOREIGN_STREAMS = {
    "iterator-passing-attributes": lambda stream, is_async: OtherLibrarysStream(stream),
    "only-iterable": lambda stream, is_async: (AsyncIterableOnlyStream if is_async else IterableOnlyStream)(stream),
}


@pytest.mark.parametrize("foreign", FOREIGN_STREAMS.values(), ids=FOREIGN_STREAMS.keys())
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_stream_another_instrumentation_wrapped_before_us_is_measured_and_its_usage_chunk_hidden(
        instrument: Any, monkeypatch: pytest.MonkeyPatch, is_async: bool, foreign: Any) -> None:
    """Instrumented first, another library hands us its own stream object: the caller still gets exactly what it
    would without us (our usage chunk was an IndexError on choices[0] in the caller's loop), and the span is a
    stream's."""
    from openai.resources.chat.completions.completions import AsyncCompletions, Completions

    def theirs(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return foreign(wrapped(*args, **kwargs), False)

    async def theirs_async(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return foreign(await wrapped(*args, **kwargs), True)

    resource = AsyncCompletions if is_async else Completions
    monkeypatch.setattr(resource, "create", wrapt.FunctionWrapper(vars(resource)["create"],
                                                                  theirs_async if is_async else theirs))
    request = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    without, _ = chat(is_async, openai_server(tokens=TOKENS, usage=USAGE), **request)
    captured = instrument()
    with_us, recorder = chat(is_async, openai_server(tokens=TOKENS, usage=USAGE), **request)

    assert recorder.requests[0].json["stream_options"] == {"include_usage": True}
    assert with_us == without and all(chunk.choices for chunk in with_us)
    attrs = attributes(captured.span())
    assert (attrs[sc.USAGE_OUTPUT_TOKENS], attrs[sc.CONTENT_CHUNKS]) == (4, 3)
    assert sc.RESPONSE_TIME_TO_FIRST_CHUNK in attrs and sc.ERROR_TYPE not in attrs
    assert captured.point(sc.STABLE_NAMES.time_to_first_chunk.name).count == 1


def test_an_async_generator_another_library_hands_back_is_cancelled_by_its_aclose(
        instrument: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from openai.resources.chat.completions.completions import AsyncCompletions

    async def theirs(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        stream = await wrapped(*args, **kwargs)

        async def chunks() -> Any:
            async for chunk in stream:
                yield chunk

        return chunks()

    monkeypatch.setattr(AsyncCompletions, "create", wrapt.FunctionWrapper(vars(AsyncCompletions)["create"], theirs))
    captured = instrument()
    client, _ = async_client(openai_server(tokens=TOKENS, usage=USAGE))

    async def first_then_aclose() -> Any:
        chunks = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
        first = await chunks.__anext__()
        await chunks.aclose()
        return first

    assert asyncio.run(first_then_aclose()).choices
    captured.assert_finished(sc.ERROR_CANCELLED)


def test_a_final_object_another_library_hands_back_for_a_stream_is_read_as_one(
        instrument: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model iterates its fields (pydantic v1's too, which has no model_fields): that is no stream."""
    from openai.resources.chat.completions.completions import Completions
    from pydantic import v1

    class Cached(v1.BaseModel):
        text: str

    def theirs(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return Cached(text="from a cache")

    monkeypatch.setattr(Completions, "create", wrapt.FunctionWrapper(vars(Completions)["create"], theirs))
    monkeypatch.setattr(_safety, "strict", False)  # not a ChatCompletion: reading it is logged, not raised
    monkeypatch.setattr(_safety, "_reported", set())
    captured = instrument()
    client, _ = sync_client([])
    result = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
    assert type(result) is Cached
    assert len(captured.spans()) == 1  # finished at once, not left for the collector as abandoned


def test_prompt_length_counts_the_text_of_every_message_shape(otel: Captured) -> None:
    """Every text the model reads again: content and its parts, and the earlier turns' refusals and tool calls (their
    arguments, a custom tool's input; the tool's name and id are not text of the conversation) passed back as dicts
    or as the client's objects."""
    call = openai.types.chat.ChatCompletionMessageFunctionToolCall(
        id="call_2", type="function", function={"name": "lookup", "arguments": '{"q": "x"}'})
    answered_before = openai.types.chat.ChatCompletionMessage(role="assistant", content="Earlier answer",
                                                              tool_calls=[call])
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is in"},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        answered_before,  # a message object passed back in
        {"role": "assistant", "function_call": {"name": "legacy", "arguments": "{}"}},
        {"role": "assistant", "content": None, "refusal": "I can't help with that."},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "Nor that."}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_3", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}}]},
        {"role": "tool", "tool_call_id": "call_3", "content": [{"type": "text", "text": "1"}]},
    ]
    chat(False, openai_server(tokens=TOKENS, usage=USAGE), model="gpt-4o-mini", messages=messages)
    expected = (len("Be brief.") + len("What is in") + len('{"city": "Paris"}') + len("42") + len("Earlier answer")
                + len('{"q": "x"}') + len("{}") + len("I can't help with that.") + len("Nor that.")
                + len("SELECT 1") + len("1"))
    assert attributes(otel.span())[sc.PROMPT_LENGTH] == expected
    assert otel.point(sc.STABLE_NAMES.prompt_length.name).sum == expected
