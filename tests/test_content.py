"""Opt-in message content, per provider, in the shapes of the GenAI conventions' JSON schemas
(gen-ai-input-messages.json, gen-ai-output-messages.json, gen-ai-system-instructions.json): messages of role and
parts, system instructions apart, tool calls and their results as parts, media described without its payload, and
output per choice with its finish reason. With capture off, nothing is recorded and no chunk does content work."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import tracemalloc
from collections import UserDict
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import anthropic
import openai
import pytest
import wire
import wire_anthropic as wa
import wire_bedrock as wb
from conftest import API_KEY, Captured, attributes, sync_client
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm import _content as ct
from otel_llm import _safety
from otel_llm import _semconv as sc
from otel_llm._content import Output
from otel_llm.providers import _claude
from otel_llm.providers import anthropic as anthropic_adapter
from otel_llm.providers import bedrock as bedrock_adapter
from otel_llm.providers import openai as openai_adapter

CONTENT_ATTRIBUTES = (sc.INPUT_MESSAGES, sc.OUTPUT_MESSAGES, sc.SYSTEM_INSTRUCTIONS)
# an image as big as a photo: what is recorded of it must be a few bytes, not this
PIXELS = base64.b64encode(bytes(range(256)) * 4096).decode()
DATA_URL = f"data:image/png;base64,{PIXELS}"
IMAGE_PART = {"type": "blob", "modality": "image", "mime_type": "image/png"}
WEATHER = {"city": "Paris"}


def text(content: str) -> dict[str, Any]:
    return {"type": "text", "content": content}


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}


def tool_result(call_id: str, response: Any) -> dict[str, Any]:
    return {"type": "tool_call_response", "id": call_id, "response": response}


class Recorded:
    """Spans and content events of one instrumentation, with content capture set to ``mode``."""

    def __init__(self, mode: str) -> None:
        self.spans = InMemorySpanExporter()
        self.logs = InMemoryLogRecordExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        logger_provider = LoggerProvider()
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.captured = Captured(self.spans, InMemoryMetricReader(), tracer_provider)
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(),
                            logger_provider=logger_provider)

    def content(self) -> dict[str, Any]:
        """The content attributes of the one span, decoded; the event beside it carries the same."""
        attrs = attributes(self.captured.span())
        assert all(isinstance(attrs[key], str) for key in CONTENT_ATTRIBUTES if key in attrs)  # JSON strings
        found = {key: json.loads(attrs[key]) for key in CONTENT_ATTRIBUTES if key in attrs}
        events = [record.log_record for record in self.logs.get_finished_logs()]
        if events:
            (event,) = events
            assert event.attributes is not None
            # structured on the event, as the conventions require there (the log record keeps lists as tuples)
            assert not any(isinstance(event.attributes[key], str) for key in CONTENT_ATTRIBUTES
                           if key in event.attributes)
            assert {key: json.loads(json.dumps(event.attributes[key])) for key in CONTENT_ATTRIBUTES
                    if key in event.attributes} == found
        recorded = json.dumps(found)
        assert PIXELS[:64] not in recorded and API_KEY not in recorded
        return found


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def start(mode: str = "SPAN_AND_EVENT") -> Recorded:
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", mode)
        return Recorded(mode)

    yield start
    otel_llm.uninstrument()


@pytest.fixture
def gathered(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every chunk any endpoint gathers content from."""
    chunks: list[Any] = []
    for endpoint in (openai_adapter._ChatCompletions, anthropic_adapter._Messages, bedrock_adapter._ConverseStream):
        original = endpoint.gather

        def spy(self: Any, op: Any, chunk: Any, original: Any = original) -> None:
            chunks.append(chunk)
            original(self, op, chunk)

        monkeypatch.setattr(endpoint, "gather", spy)
    return chunks


# --- openai ----------------------------------------------------------------------------------------------------

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather here?"},
                                 {"type": "image_url", "image_url": {"url": DATA_URL}}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
]
CHAT_IN = [
    {"role": "system", "parts": [text("Be brief.")]},
    {"role": "user", "parts": [text("Weather here?"), IMAGE_PART]},
    {"role": "assistant", "parts": [tool_call("call_1", "get_weather", WEATHER)]},
    {"role": "tool", "parts": [tool_result("call_1", "18C, sunny")]},
]


@pytest.mark.parametrize("mode", ["SPAN_ONLY", "SPAN_AND_EVENT"])
def test_openai_chat_turns_become_role_and_parts(record: Any, mode: str) -> None:
    recorded = record(mode)
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("Sunny, 18C."))])
    client.chat.completions.create(model="m", messages=CHAT)
    assert recorded.content() == {
        sc.INPUT_MESSAGES: CHAT_IN,  # system messages keep their role: no system instructions apart
        sc.OUTPUT_MESSAGES: [{"role": "assistant", "parts": [text("Sunny, 18C.")], "finish_reason": "stop"}],
    }


# a prompt whose parts come from generators, made anew for each call: the client reads them up as it sends them
PROMPT_ITERATORS = {
    "messages": lambda messages: (message for message in messages),
    "content parts": lambda messages: [{**message, "content": (part for part in message["content"])}
                                       if isinstance(message["content"], list) else message for message in messages],
}
# how the server answers a call: with the answer, an error, or a 429 and then the answer
ANSWERS = {
    "answered": lambda answer: [answer],
    "refused": lambda _: [wire.Reply.json(wire.error_body("No."), status=400)],
    "retried": lambda answer: [wire.Reply.rate_limited(0.0), answer],
}


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("given", PROMPT_ITERATORS)
def test_openai_prompt_from_an_iterator_is_read_from_the_request_as_sent(record: Any, given: str, answer: str) -> None:
    """Reading an iterator would use it up before the client sends it: the prompt's length and content are read
    from the request body as the client sent it, once a response to it arrives (an error's, a retried one's), and
    are what they are for the same prompt in lists. The request goes out as it does with lists."""
    recorded = record("SPAN_ONLY")
    reply = wire.Reply.json(wire.chat_completion_body("Sunny, 18C."))
    client, recorder = sync_client(ANSWERS[answer](reply) * 2, max_retries=1)  # a call each way
    for messages in (CHAT, PROMPT_ITERATORS[given](CHAT)):
        with contextlib.suppress(openai.BadRequestError):
            client.chat.completions.create(model="m", messages=messages)
    from_lists, from_iterators = (attributes(span) for span in recorded.captured.spans())
    assert from_iterators[sc.PROMPT_LENGTH] == from_lists[sc.PROMPT_LENGTH] == len("Be brief.Weather here?"
                                                                                   '{"city": "Paris"}18C, sunny')
    assert json.loads(from_iterators[sc.INPUT_MESSAGES]) == json.loads(from_lists[sc.INPUT_MESSAGES]) == CHAT_IN
    sent = [request.json for request in recorder.requests]
    assert sent[len(sent) // 2:] == sent[:len(sent) // 2]


def test_a_prompt_from_an_iterator_sent_in_a_body_we_cannot_read_has_no_length(record: Any) -> None:
    """A client that compresses what it sends: no length, rather than a guess."""
    recorded = record("SPAN_ONLY")
    http = wire.http_module()
    reply = wire.Reply.json(wire.chat_completion_body("Sunny, 18C."))

    class Compressing(http.Client):  # type: ignore[misc, name-defined]
        def send(self, request: Any, **kwargs: Any) -> Any:
            body = gzip.compress(request.read())
            headers = {**request.headers, "content-encoding": "gzip", "content-length": str(len(body))}
            return super().send(http.Request(request.method, request.url, headers=headers, content=body), **kwargs)

    recorder = wire.Recorder(lambda _: reply)
    client = openai.OpenAI(api_key=API_KEY, max_retries=0,
                           http_client=Compressing(transport=http.MockTransport(wire._InProcessServer(recorder).handle)))
    client.chat.completions.create(model="m", messages=iter(CHAT))
    assert sc.PROMPT_LENGTH not in attributes(recorded.captured.span())
    assert json.loads(gzip.decompress(recorder.requests[0].body))["messages"][0] == CHAT[0]


def test_openai_chat_messages_of_any_mapping_read_as_dicts(record: Any) -> None:
    """The client sends any Mapping as the dict it is (MappingProxyType, UserDict, a TypedDict's dict)."""
    recorded = record()
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("Sunny, 18C."))])
    messages = [MappingProxyType(CHAT[0]), UserDict({**CHAT[1], "content": [MappingProxyType(CHAT[1]["content"][0]),
                                                                            CHAT[1]["content"][1]]})]
    client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    assert recorded.content()[sc.INPUT_MESSAGES] == CHAT_IN[:2]


def test_text_is_written_as_it_is_and_what_utf8_cannot_hold_as_a_replacement(record: Any) -> None:
    """Text outside ASCII as itself, not \\u-escaped; a lone surrogate a server escaped into its JSON (which no
    UTF-8 holds, so OTLP could not send the batch with it) as U+FFFD. Both encode to OTLP bytes."""
    recorded = record()
    body = wire.chat_completion_body("晴れ")
    answer = json.dumps(body).replace("\\u6674\\u308c", "\\u6674\\ud800")  # the server's "晴" and a lone half
    client, _ = sync_client([wire.Reply(200, answer.encode(), {"content-type": "application/json"})])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "天気は?"}])
    assert '"天気は?"' in attributes(recorded.captured.span())[sc.INPUT_MESSAGES]
    assert recorded.content()[sc.OUTPUT_MESSAGES][0]["parts"] == [text("晴\ufffd")]
    encode_spans(recorded.captured.spans()).SerializeToString()
    encode_logs(list(recorded.logs.get_finished_logs())).SerializeToString()


def test_openai_chat_streamed_tool_call_is_assembled_from_its_deltas(record: Any) -> None:
    recorded = record()
    client, _ = sync_client([wire.Reply.stream(wire.chat_stream(['{"city"', ': "Par', 'is"}'], tool_call=True))])
    list(client.chat.completions.create(model="m", messages=CHAT[:2], stream=True))
    assert recorded.content()[sc.OUTPUT_MESSAGES] == [{
        "role": "assistant", "parts": [tool_call(wire.TOOL_CALL_ID, wire.TOOL_NAME, WEATHER)],
        "finish_reason": "tool_calls"}]


def test_openai_chat_parse_and_stream_helper_record_the_same(record: Any) -> None:
    recorded = record()
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("Hi")),
                             wire.Reply.stream(wire.chat_stream(["H", "i"]))])
    client.chat.completions.parse(model="m", messages=CHAT[:1])
    with client.chat.completions.stream(model="m", messages=CHAT[:1]) as stream:
        stream.until_done()
    parsed, streamed = (json.loads(attributes(span)[sc.OUTPUT_MESSAGES]) for span in recorded.captured.spans())
    assert parsed == streamed == [{"role": "assistant", "parts": [text("Hi")], "finish_reason": "stop"}]


def test_openai_chat_one_output_message_per_choice(record: Any) -> None:
    recorded = record()
    body = wire.chat_completion_body("Yes")
    body["choices"].append({**body["choices"][0], "index": 1, "finish_reason": "length",
                            "message": {**body["choices"][0]["message"], "content": "No"}})
    client, _ = sync_client([wire.Reply.json(body)])
    client.chat.completions.create(model="m", messages=CHAT[:1], n=2)
    assert recorded.content()[sc.OUTPUT_MESSAGES] == [
        {"role": "assistant", "parts": [text("Yes")], "finish_reason": "stop"},
        {"role": "assistant", "parts": [text("No")], "finish_reason": "length"},
    ]


def test_openai_responses_instructions_are_system_instructions(record: Any) -> None:
    recorded = record()
    body = wire.response_body("Sunny.")
    body["output"].append({"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "get_weather",
                           "arguments": '{"city": "Paris"}', "status": "completed"})
    client, _ = sync_client([wire.Reply.json(body), wire.Reply.json(wire.response_body("Hi"))])
    client.responses.create(model="m", instructions="Be brief.", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"},
                                     {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    ])
    client.responses.create(model="m", input="Hello")
    first, second = recorded.captured.spans()
    assert {key: json.loads(attributes(first)[key]) for key in CONTENT_ATTRIBUTES} == {
        sc.SYSTEM_INSTRUCTIONS: [text("Be brief.")],
        sc.INPUT_MESSAGES: [
            {"role": "user", "parts": [text("Weather?"), IMAGE_PART]},
            {"role": "assistant", "parts": [tool_call("call_1", "get_weather", WEATHER)]},
            {"role": "tool", "parts": [tool_result("call_1", "18C")]},
        ],
        sc.OUTPUT_MESSAGES: [{"role": "assistant", "parts": [text("Sunny."), tool_call("call_2", "get_weather",
                                                                                       WEATHER)],
                              "finish_reason": "completed"}],
    }
    assert json.loads(attributes(second)[sc.INPUT_MESSAGES]) == [{"role": "user", "parts": [text("Hello")]}]
    assert sc.SYSTEM_INSTRUCTIONS not in attributes(second)


def test_openai_compaction_captures_its_input_and_no_output(record: Any) -> None:
    """A compaction's output is the conversation shortened (the user's messages and an encrypted item), not an
    answer of the model's: its input and instructions are captured, no output messages."""
    recorded = record()
    usage = wire.Usage(input=50, output=10)
    client, _ = sync_client([wire.Reply.json(wire.compaction_body(["Plan a trip"], usage=usage))])
    client.responses.compact(model="gpt-5.4", instructions="Keep the dates.", input=[
        {"role": "user", "content": "Plan a trip"}, {"role": "assistant", "content": "Paris, 3 days"}])
    assert recorded.content() == {
        sc.SYSTEM_INSTRUCTIONS: [text("Keep the dates.")],
        sc.INPUT_MESSAGES: [{"role": "user", "parts": [text("Plan a trip")]},
                            {"role": "assistant", "parts": [text("Paris, 3 days")]}],
    }


def test_openai_decision_captures_its_input_and_no_output(record: Any) -> None:
    """A decision's answers are probabilities over the questions asked, not an answer of the model's in words: its
    input messages are captured, no output messages."""
    recorded = record()
    body = wire.decision_body([{"type": "predicate", "name": None, "probability": 0.2}], usage=wire.Usage(40, 2))
    client, _ = sync_client([wire.Reply.json(body)])
    client.decisions.create(model="gpt-6-luna", questions=[{"type": "predicate", "instructions": "Is it urgent?"}],
                            input=[{"role": "developer", "content": "Triage tickets."},
                                   {"role": "user", "content": [{"type": "input_text", "text": "Charged twice"}]}])
    assert recorded.content() == {
        sc.INPUT_MESSAGES: [{"role": "developer", "parts": [text("Triage tickets.")]},
                            {"role": "user", "parts": [text("Charged twice")]}],
    }


def test_openai_responses_stream_output(record: Any) -> None:
    recorded = record()
    client, _ = sync_client([wire.Reply.stream(wire.responses_stream(["Hel", "lo"], usage=wire.Usage(3, 2)))])
    list(client.responses.create(model="m", input="Hi", stream=True))
    assert recorded.content()[sc.OUTPUT_MESSAGES] == [
        {"role": "assistant", "parts": [text("Hello")], "finish_reason": "completed"}]


def test_openai_legacy_completion_prompt_is_a_user_message(record: Any) -> None:
    recorded = record()
    client, _ = sync_client([wire.Reply.json(wire.completion_body(" world"))])
    client.completions.create(model="m", prompt="Hello")
    assert recorded.content() == {
        sc.INPUT_MESSAGES: [{"role": "user", "parts": [text("Hello")]}],
        sc.OUTPUT_MESSAGES: [{"role": "assistant", "parts": [text(" world")], "finish_reason": "stop"}],
    }


# --- anthropic -------------------------------------------------------------------------------------------------

ANTHROPIC_MESSAGES = [
    {"role": "user", "content": [
        {"type": "text", "text": "Weather here?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXELS}}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Use the tool.", "signature": wa.SIGNATURE},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": WEATHER}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C, sunny"}]},
]


@pytest.mark.parametrize("system", ["Be brief.", [{"type": "text", "text": "Be brief."}]], ids=["str", "blocks"])
def test_anthropic_turns_and_streamed_tool_call(record: Any, system: Any) -> None:
    recorded = record()
    http, _ = wire.mock_client([wa.stream_reply(wa.message_events(
        [("text", ["Let me check."]), ("tool_use", ['{"city":', ' "Paris"}'])], usage=wa.Usage(input=9, output=5)))])
    client = anthropic.Anthropic(api_key=API_KEY, http_client=http, max_retries=0)
    list(client.messages.create(model=wa.MODEL, max_tokens=64, system=system, messages=ANTHROPIC_MESSAGES,
                                stream=True))
    assert recorded.content() == {
        sc.SYSTEM_INSTRUCTIONS: [text("Be brief.")],  # apart from the messages, never one of them
        sc.INPUT_MESSAGES: [
            {"role": "user", "parts": [text("Weather here?"), IMAGE_PART]},
            {"role": "assistant", "parts": [{"type": "reasoning", "content": "Use the tool."},
                                            tool_call("toolu_1", "get_weather", WEATHER)]},
            {"role": "user", "parts": [tool_result("toolu_1", "18C, sunny")]},
        ],
        sc.OUTPUT_MESSAGES: [{"role": "assistant", "finish_reason": "tool_use", "parts": [
            text("Let me check."), tool_call(wa.TOOL_USE_ID, wa.TOOL_NAME, WEATHER)]}],
    }


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("given", PROMPT_ITERATORS)
def test_anthropic_prompt_from_an_iterator_is_read_from_the_request_as_sent(record: Any, given: str,
                                                                            answer: str) -> None:
    """As openai's: a system prompt in blocks and messages from iterators, read from the body as sent."""
    recorded = record("SPAN_ONLY")
    reply = wa.json_reply(wa.message_body("Sunny.", usage=wa.Usage(input=9, output=2)))
    refusal = wa.json_reply(wa.error_body("invalid_request_error", "No."), status=400)
    replies = {"answered": [reply], "refused": [refusal], "retried": [wa.rate_limited(0.0), reply]}[answer]
    http, recorder = wire.mock_client(replies * 2)
    client = anthropic.Anthropic(api_key=API_KEY, http_client=http, max_retries=1)
    system = [{"type": "text", "text": "Be brief."}]
    for blocks, messages in ((system, ANTHROPIC_MESSAGES), (iter(system), PROMPT_ITERATORS[given](ANTHROPIC_MESSAGES))):
        with contextlib.suppress(anthropic.BadRequestError):
            client.messages.create(model=wa.MODEL, max_tokens=64, system=blocks, messages=messages)
    from_lists, from_iterators = (attributes(span) for span in recorded.captured.spans())
    assert from_iterators[sc.PROMPT_LENGTH] == from_lists[sc.PROMPT_LENGTH] == len(
        'Be brief.Weather here?{"city":"Paris"}18C, sunny')
    for key in (sc.SYSTEM_INSTRUCTIONS, sc.INPUT_MESSAGES):
        assert json.loads(from_iterators[key]) == json.loads(from_lists[key])
    sent = [request.json for request in recorder.requests]
    assert sent[len(sent) // 2:] == sent[:len(sent) // 2]


def test_anthropic_whole_message_output(record: Any) -> None:
    recorded = record()
    body = wa.message_body("Checking.", usage=wa.Usage(input=9, output=5), stop_reason="tool_use")
    body["content"].append({"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": WEATHER})
    http, _ = wire.mock_client([wire.Reply.json(body)])
    client = anthropic.Anthropic(api_key=API_KEY, http_client=http, max_retries=0)
    client.messages.create(model=wa.MODEL, max_tokens=64, messages=ANTHROPIC_MESSAGES[:1])
    assert recorded.content()[sc.OUTPUT_MESSAGES] == [{"role": "assistant", "finish_reason": "tool_use", "parts": [
        text("Checking."), tool_call("toolu_2", "get_weather", WEATHER)]}]


def test_anthropic_server_tool_use_streamed_is_recorded_as_the_whole_message_records_it(record: Any) -> None:
    """A tool the service runs itself (web search) is no tool call of the caller's: its input streams as a tool
    call's arguments do, and is left out of the output either way."""
    recorded = record("SPAN_ONLY")
    search = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    found = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    events = wa.text_events(["Sunny."], usage=wa.Usage(input=5, output=9))
    start = events.index(next(event for event in events if event[0] == "content_block_start"))
    events[start:start] = [
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": search}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": '{"query": "weather paris"}'}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": found}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1})]
    for event in events[start + 5:]:  # the answer's text is the third block now
        if "index" in event[1]:
            event[1]["index"] = 2
    body = wa.message_body("Sunny.", usage=wa.Usage(input=5, output=9))
    body["content"][:0] = [{**search, "input": {"query": "weather paris"}}, found]
    http, _ = wire.mock_client([wa.stream_reply(events), wire.Reply.json(body)])
    client = anthropic.Anthropic(api_key=API_KEY, http_client=http, max_retries=0)
    list(client.messages.create(model=wa.MODEL, max_tokens=64, messages=ANTHROPIC_MESSAGES[:1], stream=True))
    client.messages.create(model=wa.MODEL, max_tokens=64, messages=ANTHROPIC_MESSAGES[:1])
    streamed, whole = (json.loads(attributes(span)[sc.OUTPUT_MESSAGES])[0]["parts"]
                       for span in recorded.captured.spans())
    assert streamed == whole == [text("Sunny.")]


# --- bedrock ---------------------------------------------------------------------------------------------------

CONVERSE_MESSAGES = [
    {"role": "user", "content": [{"text": "Weather here?"},
                                 {"image": {"format": "png", "source": {"bytes": base64.b64decode(PIXELS)}}}]},
    {"role": "assistant", "content": [{"toolUse": {"toolUseId": "tu_1", "name": "get_weather", "input": WEATHER}}]},
    {"role": "user", "content": [{"toolResult": {"toolUseId": "tu_1", "content": [{"json": {"celsius": 18}}]}}]},
]


def converse_tool_stream() -> list[bytes]:
    return [
        wb.event("messageStart", {"role": "assistant"}),
        wb.event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Checking."}}),
        wb.event("contentBlockStop", {"contentBlockIndex": 0}),
        wb.event("contentBlockStart", {"contentBlockIndex": 1,
                                       "start": {"toolUse": {"toolUseId": "tu_2", "name": "get_weather"}}}),
        wb.event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"city": '}}}),
        wb.event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '"Paris"}'}}}),
        wb.event("contentBlockStop", {"contentBlockIndex": 1}),
        wb.event("messageStop", {"stopReason": "tool_use"}),
        wb.event("metadata", {"usage": {"inputTokens": 9, "outputTokens": 5, "totalTokens": 14},
                              "metrics": {"latencyMs": 10}}),
    ]


# what the conversation above and converse_tool_stream()'s answer are captured as, under a system of "Be brief."
CONVERSE_TOOL_STREAM_CONTENT = {
    sc.SYSTEM_INSTRUCTIONS: [text("Be brief.")],
    sc.INPUT_MESSAGES: [
        {"role": "user", "parts": [text("Weather here?"), IMAGE_PART]},
        {"role": "assistant", "parts": [tool_call("tu_1", "get_weather", WEATHER)]},
        {"role": "user", "parts": [tool_result("tu_1", [{"celsius": 18}])]},
    ],
    sc.OUTPUT_MESSAGES: [{"role": "assistant", "finish_reason": "tool_use", "parts": [
        text("Checking."), tool_call("tu_2", "get_weather", WEATHER)]}],
}


def test_bedrock_converse_stream_turns_and_streamed_tool_call(record: Any) -> None:
    recorded = record()
    with wire.LoopbackServer([wb.stream_reply(converse_tool_stream())]) as server:
        response = wb.client(server).converse_stream(modelId="m", system=[{"text": "Be brief."}, {"cachePoint": {
            "type": "default"}}], messages=CONVERSE_MESSAGES)
        list(response["stream"])
    assert recorded.content() == CONVERSE_TOOL_STREAM_CONTENT


def test_bedrock_converse_whole_output(record: Any) -> None:
    recorded = record()
    body = wb.converse_body("Checking.", usage=wb.Tokens(input=9, output=5), latency_ms=10, stop_reason="tool_use")
    body["output"]["message"]["content"].append({"toolUse": {"toolUseId": "tu_2", "name": "get_weather",
                                                             "input": WEATHER}})
    with wire.LoopbackServer([wb.converse_reply(body)]) as server:
        wb.client(server).converse(modelId="m", messages=CONVERSE_MESSAGES[:1])
    assert recorded.content()[sc.OUTPUT_MESSAGES] == [{"role": "assistant", "finish_reason": "tool_use", "parts": [
        text("Checking."), tool_call("tu_2", "get_weather", WEATHER)]}]


def test_bedrock_converse_cited_answer_is_text(record: Any) -> None:
    """An answer citing the documents it was given comes in a citationsContent block: its text is the answer's."""
    recorded = record()
    body = wb.converse_body("", usage=wb.Tokens(input=9, output=5), latency_ms=10)
    body["output"]["message"]["content"] = [{"citationsContent": {
        "content": [{"text": "Paris is "}, {"text": "the capital."}],
        "citations": [{"title": "atlas", "sourceContent": [{"text": "Paris, capital of France"}],
                       "location": {"documentChar": {"documentIndex": 0, "start": 0, "end": 24}}}]}}]
    with wire.LoopbackServer([wb.converse_reply(body)]) as server:
        wb.client(server).converse(modelId="m", messages=CONVERSE_MESSAGES[:1])
    assert recorded.content()[sc.OUTPUT_MESSAGES] == [{"role": "assistant", "finish_reason": "end_turn", "parts": [
        text("Paris is the capital.")]}]


def test_bedrock_invoke_model_claude_body(record: Any) -> None:
    recorded = record()
    claude = wb.FORMAT["claude-messages"]
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64, "system": "Be brief.",
            "messages": ANTHROPIC_MESSAGES}
    with wire.LoopbackServer([wb.invoke_reply(claude.body(["Sunny"], wb.Tokens(input=9, output=1)))]) as server:
        wb.client(server).invoke_model(modelId=claude.model_id, body=json.dumps(body))
    content = recorded.content()
    assert content[sc.SYSTEM_INSTRUCTIONS] == [text("Be brief.")]
    assert content[sc.INPUT_MESSAGES][0] == {"role": "user", "parts": [text("Weather here?"), IMAGE_PART]}
    assert content[sc.INPUT_MESSAGES][2] == {"role": "user", "parts": [tool_result("toolu_1", "18C, sunny")]}
    assert content[sc.OUTPUT_MESSAGES] == [{"role": "assistant", "parts": [text("Sunny")],
                                            "finish_reason": claude.stop_reason}]


# --- capture off -----------------------------------------------------------------------------------------------


def test_capture_off_records_no_content_and_gathers_no_chunk(record: Any, gathered: list[Any]) -> None:
    recorded = record("NO_CONTENT")
    openai_client, _ = sync_client([wire.Reply.stream(wire.chat_stream(["{}"], tool_call=True))])
    list(openai_client.chat.completions.create(model="m", messages=CHAT, stream=True))
    http, _ = wire.mock_client([wa.stream_reply(wa.message_events([("tool_use", ["{}"])], usage=wa.Usage(1, 1)))])
    client = anthropic.Anthropic(api_key=API_KEY, http_client=http, max_retries=0)
    list(client.messages.create(model=wa.MODEL, max_tokens=8, system="Be brief.", messages=ANTHROPIC_MESSAGES,
                                stream=True))
    with wire.LoopbackServer([wb.stream_reply(converse_tool_stream())]) as server:
        list(wb.client(server).converse_stream(modelId="m", messages=CONVERSE_MESSAGES)["stream"])
    spans = recorded.captured.spans()
    assert len(spans) == 3
    for span in spans:
        assert not set(CONTENT_ATTRIBUTES) & set(attributes(span))
    assert recorded.logs.get_finished_logs() == ()
    assert gathered == []  # no chunk did any content work


def test_capture_on_gathers_every_chunk(record: Any, gathered: list[Any]) -> None:
    record("SPAN_ONLY")
    client, _ = sync_client([wire.Reply.stream(wire.chat_stream(["{}"], tool_call=True))])
    chunks = list(client.chat.completions.create(model="m", messages=CHAT, stream=True))
    assert len(gathered) == len(chunks) == 3


# --- what is recorded never changes what is sent; a failure costs the content only --------------------------------


def test_iterables_the_caller_passed_are_not_used_up(record: Any) -> None:
    """The client reads them to build the request after we looked: we only read lists and tuples."""
    record()
    client, recorder = sync_client([wire.Reply.json(wire.chat_completion_body("ok"))])
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
    messages = [CHAT[0], {"role": "assistant", "content": None, "tool_calls": (call for call in calls)}]
    client.chat.completions.create(model="m", messages=messages)
    assert recorder.requests[0].json["messages"][1]["tool_calls"] == calls


def test_a_content_shape_we_cannot_read_costs_the_content_not_the_operation(
        record: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_safety, "strict", False)
    monkeypatch.setattr(_safety, "_reported", set())

    def unreadable(messages: Any) -> Any:
        raise RecursionError("a shape our conversion does not survive")

    monkeypatch.setattr(_claude, "messages", unreadable)
    recorded = record()
    http, _ = wire.mock_client([wire.Reply.json(wa.message_body("ok", usage=wa.Usage(input=9, output=1)))])
    client = anthropic.Anthropic(api_key=API_KEY, http_client=http, max_retries=0)
    client.messages.create(model=wa.MODEL, max_tokens=8, system="Be brief.", messages=ANTHROPIC_MESSAGES[:1])
    attrs = attributes(recorded.captured.span())
    assert sc.INPUT_MESSAGES not in attrs and sc.SYSTEM_INSTRUCTIONS in attrs
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == 1
    assert "otel_llm: internal failure in content; telemetry for this call is incomplete" in caplog.messages


def test_arguments_json_has_no_words_for_are_written_as_strings(record: Any) -> None:
    recorded = record()
    arguments = '{"x": NaN, "y": Infinity}'
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("ok"))])
    client.chat.completions.create(model="m", messages=[{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}])
    recorded_json = attributes(recorded.captured.span())[sc.INPUT_MESSAGES]

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    decoded = json.loads(recorded_json, parse_constant=refuse)  # what strict parsers (JS, Go) read
    assert decoded[0]["parts"][0]["arguments"] == {"x": "nan", "y": "inf"}


# --- output is what the caller received --------------------------------------------------------------------------


def test_openai_output_keeps_reasoning_refusal_and_audio_transcript(record: Any) -> None:
    recorded = record()
    events = wire.chat_stream(["Sunny"])
    reasoning = json.loads(events[1].removeprefix(b"data: "))
    reasoning["choices"][0]["delta"] = {"reasoning_content": "Check the sky."}
    events.insert(1, wire.sse(reasoning))
    body = wire.chat_completion_body("")
    body["choices"][0]["message"].update(content=None, refusal="I can't help with that.",
                                         audio={"id": "a", "data": PIXELS, "transcript": "Hello.", "expires_at": 1})
    client, _ = sync_client([wire.Reply.stream(events), wire.Reply.json(body)])
    list(client.chat.completions.create(model="m", messages=CHAT[:1], stream=True))
    client.chat.completions.create(model="m", messages=CHAT[:1])
    streamed, whole = (json.loads(attributes(span)[sc.OUTPUT_MESSAGES]) for span in recorded.captured.spans())
    assert streamed[0]["parts"] == [{"type": "reasoning", "content": "Check the sky."}, text("Sunny")]
    assert whole[0]["parts"] == [text("Hello."), {"type": "refusal", "content": "I can't help with that."}]


def test_anthropic_output_keeps_its_thinking(record: Any) -> None:
    recorded = record()
    http, _ = wire.mock_client([wa.stream_reply(wa.message_events(
        [("thinking", ["Hm", "m."]), ("text", ["Hi"])], usage=wa.Usage(input=9, output=5)))])
    client = anthropic.Anthropic(api_key=API_KEY, http_client=http, max_retries=0)
    list(client.messages.create(model=wa.MODEL, max_tokens=64, messages=ANTHROPIC_MESSAGES[:1], stream=True))
    assert recorded.content()[sc.OUTPUT_MESSAGES][0]["parts"] == [{"type": "reasoning", "content": "Hmm."},
                                                                  text("Hi")]


@pytest.mark.parametrize("model, body", [
    ("cohere.command-text-v14", {"id": "g", "generations": [{"id": "1", "text": "First.", "finish_reason": "COMPLETE"},
                                                            {"id": "2", "text": "Second.",
                                                             "finish_reason": "MAX_TOKENS"}]}),
    ("amazon.titan-text-express-v1", {"inputTextTokenCount": 3, "results": [
        {"tokenCount": 2, "outputText": "First.", "completionReason": "FINISH"},
        {"tokenCount": 2, "outputText": "Second.", "completionReason": "LENGTH"}]}),
    ("mistral.mistral-7b-instruct-v0:2", {"outputs": [{"text": "First.", "stop_reason": "stop"},
                                                      {"text": "Second.", "stop_reason": "length"}]}),
], ids=["cohere", "titan", "mistral"])
def test_bedrock_invoke_body_with_several_generations_is_one_message_each(record: Any, model: str,
                                                                          body: dict[str, Any]) -> None:
    """Each generation with the reason it gives for stopping."""
    recorded = record()
    with wire.LoopbackServer([wb.invoke_reply(body)]) as server:
        wb.client(server).invoke_model(modelId=model, body=json.dumps({"prompt": "Hi"}))
    items = next(iter(value for value in body.values() if isinstance(value, list)))
    reasons = [next(value for key, value in item.items() if key.endswith(("reason", "Reason"))) for item in items]
    assert recorded.content()[sc.OUTPUT_MESSAGES] == [
        {"role": "assistant", "parts": [text(answer)], "finish_reason": reason}
        for answer, reason in zip(("First.", "Second."), reasons, strict=True)]


def test_bedrock_cohere_chat_history_roles_are_the_conventions(record: Any) -> None:
    recorded = record()
    body = {"message": "And now?", "chat_history": [{"role": "USER", "message": "Hi"},
                                                    {"role": "CHATBOT", "message": "Hello."}]}
    with wire.LoopbackServer([wb.invoke_reply({"response_id": "r", "text": "Now.", "finish_reason": "COMPLETE"})]) \
            as server:
        wb.client(server).invoke_model(modelId="cohere.command-r-v1:0", body=json.dumps(body))
    assert [message["role"] for message in recorded.content()[sc.INPUT_MESSAGES]] == ["user", "assistant", "user"]


def test_openai_responses_failed_keeps_what_streamed(record: Any) -> None:
    recorded = record()
    failed = wire._response("resp_1", "gpt-4.1", "failed", [], None)
    failed["error"] = {"code": "server_error", "message": "The model failed"}
    where = {"item_id": "m", "output_index": 0, "content_index": 0, "logprobs": []}
    events = [("response.created", {"response": wire._response("resp_1", "gpt-4.1", "in_progress", [], None)}),
              ("response.output_text.delta", {**where, "delta": "He"}),
              ("response.output_text.delta", {**where, "delta": "llo"}),
              ("response.failed", {"response": failed})]
    stream = [wire.sse({"type": kind, "sequence_number": n, **data}, event=kind) for n, (kind, data) in
              enumerate(events)]
    client, _ = sync_client([wire.Reply.stream(stream)])
    list(client.responses.create(model="gpt-4.1", input="hi", stream=True))
    assert recorded.content()[sc.OUTPUT_MESSAGES] == [
        {"role": "assistant", "parts": [text("Hello")], "finish_reason": "failed"}]


def responses_events(events: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
    return [wire.sse({"type": kind, "sequence_number": n, **data}, event=kind) for n, (kind, data) in enumerate(events)]


REASONING_ITEM = {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Think hard."}]}
CALL_ITEM = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Paris"}', "status": "completed"}
# a reasoning summary, then a function call, each streamed in two deltas; no final event yet
RESPONSES_HEAD = [
    ("response.created", {"response": wire._response("resp_1", "gpt-5", "in_progress", [], None)}),
    ("response.output_item.added", {"output_index": 0, "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
    *(("response.reasoning_summary_text.delta", {"item_id": "rs_1", "output_index": 0, "summary_index": 0,
                                                 "delta": delta}) for delta in ("Think ", "hard.")),
    ("response.output_item.done", {"output_index": 0, "item": REASONING_ITEM}),
    ("response.output_item.added", {"output_index": 1,
                                    "item": {**CALL_ITEM, "arguments": "", "status": "in_progress"}}),
    *(("response.function_call_arguments.delta", {"item_id": "fc_1", "output_index": 1, "delta": delta})
      for delta in ('{"city": ', '"Paris"}')),
]


@pytest.mark.parametrize("ending", ["completed", "caller stops", "connection lost"])
def test_openai_responses_stream_keeps_what_streamed_however_it_ends(record: Any, ending: str) -> None:
    """Reasoning and function calls are gathered as they stream, as text is: a stream that never reaches its final
    event keeps them as far as they came (the final event, when it comes, gives the whole output)."""
    recorded = record("SPAN_ONLY")
    completed = ("response.completed", {"response": wire._response("resp_1", "gpt-5", "completed",
                                                                   [REASONING_ITEM, CALL_ITEM], wire.Usage(5, 9))})
    events = responses_events([*RESPONSES_HEAD, completed])
    client, _ = sync_client([wire.Reply.stream(events, drop_after=len(events) - 1 if ending == "connection lost"
                                               else None)])
    stream = client.responses.create(model="gpt-5", input="Weather?", stream=True)
    with contextlib.suppress(openai.APIConnectionError):
        for event in stream:
            if ending == "caller stops" and event.type == "response.function_call_arguments.delta" and (
                    event.delta.endswith("}")):
                break
    stream.close()
    (message,) = recorded.content()[sc.OUTPUT_MESSAGES]
    assert message["parts"] == [{"type": "reasoning", "content": "Think hard."},
                                tool_call("call_1", "get_weather", {"city": "Paris"})]


SEARCH_ITEM = {"id": "ws_1", "type": "web_search_call", "status": "completed",
               "action": {"type": "search", "query": "weather Paris"}}
CUSTOM_ITEM = {"id": "ctc_1", "type": "custom_tool_call", "call_id": "call_ct", "name": "sql", "input": "SELECT 2"}


@pytest.mark.parametrize("ending", ["whole", "completed", "broken off"])
def test_openai_responses_custom_and_hosted_tool_calls_are_output(record: Any, ending: str) -> None:
    """A custom tool call is a tool call, its input the arguments (as chat's custom calls are); a call of a tool the
    service runs (web search) is a part named by its type, as in the input, its payload not copied. Streamed, both
    are gathered as they come, so a stream broken off keeps them."""
    recorded = record("SPAN_ONLY")
    client, _ = sync_client([wire.Reply.json(wire._response("resp_1", "gpt-5", "completed", [SEARCH_ITEM, CUSTOM_ITEM],
                                                            wire.Usage(5, 9)))] if ending == "whole" else [
        wire.Reply.stream(responses_events([
            ("response.created", {"response": wire._response("resp_1", "gpt-5", "in_progress", [], None)}),
            ("response.output_item.added", {"output_index": 0, "item": {**SEARCH_ITEM, "status": "in_progress"}}),
            ("response.web_search_call.completed", {"output_index": 0, "item_id": "ws_1"}),
            ("response.output_item.done", {"output_index": 0, "item": SEARCH_ITEM}),
            ("response.output_item.added", {"output_index": 1, "item": {**CUSTOM_ITEM, "input": ""}}),
            *(("response.custom_tool_call_input.delta", {"item_id": "ctc_1", "output_index": 1, "delta": delta})
              for delta in ("SELECT", " 2")),
            *([("response.completed", {"response": wire._response(
                "resp_1", "gpt-5", "completed", [SEARCH_ITEM, CUSTOM_ITEM], wire.Usage(5, 9))})]
              if ending == "completed" else []),
        ]))])
    if ending == "whole":
        client.responses.create(model="gpt-5", input="Weather?")
    else:
        list(client.responses.create(model="gpt-5", input="Weather?", stream=True))
    (message,) = recorded.content()[sc.OUTPUT_MESSAGES]
    assert message["parts"] == [{"type": "web_search_call"}, tool_call("call_ct", "sql", "SELECT 2")]
    assert "weather Paris" not in json.dumps(message)


def test_openai_responses_custom_tool_calls_in_the_input_are_tool_calls_and_their_results(record: Any) -> None:
    recorded = record()
    client, _ = sync_client([wire.Reply.json(wire._response("resp_2", "gpt-5", "completed", [], wire.Usage(5, 9)))])
    client.responses.create(model="gpt-5", input=[  # type: ignore[list-item]
        {"role": "user", "content": "How many?"}, CUSTOM_ITEM,
        {"type": "custom_tool_call_output", "call_id": "call_ct", "output": "2"}])
    assert recorded.content()[sc.INPUT_MESSAGES] == [
        {"role": "user", "parts": [text("How many?")]},
        {"role": "assistant", "parts": [tool_call("call_ct", "sql", "SELECT 2")]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_ct", "response": "2"}]}]


def test_openai_responses_reasoning_text_is_reasoning(record: Any) -> None:
    """Reasoning text itself (gpt-oss on compatible servers), not only its summary: streamed, and in the item."""
    recorded = record("SPAN_ONLY")
    item = {"id": "rs_1", "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": "Let me see."}]}
    events = responses_events([
        ("response.created", {"response": wire._response("resp_1", "gpt-oss", "in_progress", [], None)}),
        ("response.output_item.added", {"output_index": 0, "item": {**item, "content": []}}),
        ("response.reasoning_text.delta", {"item_id": "rs_1", "output_index": 0, "content_index": 0,
                                           "delta": "Let me see."}),
        ("response.output_item.done", {"output_index": 0, "item": item}),
    ])
    client, _ = sync_client([wire.Reply.stream(events), wire.Reply.json(wire._response(
        "resp_2", "gpt-oss", "completed", [item], wire.Usage(5, 9)))])
    list(client.responses.create(model="gpt-oss", input="Hi", stream=True))  # broken off before its final event
    client.responses.create(model="gpt-oss", input="Hi")
    for span in recorded.captured.spans():
        assert json.loads(attributes(span)[sc.OUTPUT_MESSAGES])[0]["parts"] == [
            {"type": "reasoning", "content": "Let me see."}]


def test_openai_chat_tool_calls_a_server_sends_without_index_stay_apart(record: Any) -> None:
    """Gemini's OpenAI-compatible endpoint sends whole calls with no index: each is its own call, by its id."""
    recorded = record()
    calls = [{"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
             {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": '{"b": 2}'}}]
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [
        {"index": 0, "delta": {"role": "assistant", "tool_calls": calls}, "finish_reason": None}]}
    finish = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    client, _ = sync_client([wire.Reply.stream([wire.sse(chunk), wire.sse(finish), wire.DONE])])
    list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], stream=True))
    assert recorded.content()[sc.OUTPUT_MESSAGES][0]["parts"] == [tool_call("call_a", "f", {"a": 1}),
                                                                  tool_call("call_b", "g", {"b": 2})]


def test_bedrock_converse_content_given_as_tuples_is_read(record: Any) -> None:
    """botocore sends a tuple as it sends a list."""
    recorded = record()
    body = wb.converse_body("Hello.", usage=wb.Tokens(input=9, output=5), latency_ms=10)
    with wire.LoopbackServer([wb.converse_reply(body)]) as server:
        wb.client(server).converse(modelId="m", system=({"text": "Be brief."},),
                                   messages=[{"role": "user", "content": ({"text": "Hi"},)}])
    content = recorded.content()
    assert content[sc.SYSTEM_INSTRUCTIONS] == [text("Be brief.")]
    assert content[sc.INPUT_MESSAGES] == [{"role": "user", "parts": [text("Hi")]}]


def test_an_answer_gathered_delta_by_delta_is_held_about_once() -> None:
    """50,000 deltas of four characters: what the capture holds while the stream goes on is near the text's own
    size (one string object per delta held ~15 times it), and joins into the same text."""
    deltas = [f"{n % 10000:04d}" for n in range(50_000)]
    output = Output()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for delta in deltas:
            output.choice().text(delta)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    text_size = sum(map(len, deltas))
    assert held < 2 * text_size, (held, text_size)
    assert output.messages([], failed=False)[0]["parts"] == [{"type": "text", "content": "".join(deltas)}]


def test_a_surrogate_pair_a_server_split_across_chunks_is_its_character() -> None:
    assert ct.to_json(["Hi \ud83d" + "\ude00!", "lone \ud800."]) == '["Hi \U0001F600!", "lone \ufffd."]'


def test_content_we_cannot_write_costs_the_content_not_the_span(
        record: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tool arguments nested deeper than Python recursion goes, with a NaN in them: the span still ends."""
    monkeypatch.setattr(_safety, "strict", False)
    monkeypatch.setattr(_safety, "_reported", set())
    recorded = record("SPAN_ONLY")
    arguments = "[" * 100_000 + "NaN" + "]" * 100_000  # too deep for json on every Python (3.13 takes 20,000)
    client, _ = sync_client([wire.Reply.json(wire.chat_completion_body("ok"))])
    client.chat.completions.create(model="m", messages=[{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}])
    attrs = attributes(recorded.captured.span())
    assert sc.INPUT_MESSAGES not in attrs and attrs[sc.RESPONSE_FINISH_REASONS] == ("stop",)
    assert json.loads(attrs[sc.OUTPUT_MESSAGES])[0]["parts"] == [text("ok")]  # the rest of the content stays
