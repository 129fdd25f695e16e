"""openai calls against a loopback OpenAI (tests/wire.py), each with the span it must end with. Run by
tests/test_client_versions.py inside a venv holding one openai release; prints the JSON report of drive.py."""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Any

import openai
import wire
from versions.drive import Scenario, Span, main

from otel_llm import _semconv as sc
from otel_llm.providers.openai import PROVIDER

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

MODEL = "gpt-4o-mini"
UNKNOWN_MODEL = "nope"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello world"}]
TOKENS = ["Hel", "lo", " wor", "ld"]
USAGE = wire.Usage(input=11, output=4)
EMBEDDING_TOKENS = 5
RATE_LIMITS = wire.openai_ratelimit_headers(500, 499, 200_000, 199_000)
THROTTLE_FIRST_TRY = "x-throttle-first-try"  # request header: the first attempt gets a 429, the retry goes through


def answer(request: wire.RecordedRequest) -> wire.Reply:
    """OpenAI's endpoints; a stream carries usage only when the caller asks for it, as OpenAI's do."""
    body = request.json
    if THROTTLE_FIRST_TRY in request.headers and request.headers["x-stainless-retry-count"] == "0":
        return wire.Reply.rate_limited(0.01)
    if body["model"] == UNKNOWN_MODEL:
        error = wire.error_body(f"The model `{UNKNOWN_MODEL}` does not exist", code="model_not_found")
        return wire.Reply.json(error, status=400, headers=RATE_LIMITS)
    text = "".join(TOKENS)
    usage = USAGE if (body.get("stream_options") or {}).get("include_usage") else None
    endpoint = request.path.removeprefix("/v1")
    if endpoint == "/embeddings":
        embeddings = wire.embedding_body(len(body["input"]), usage_prompt_tokens=EMBEDDING_TOKENS,
                                         encoding_format=body["encoding_format"])
        return wire.Reply.json(embeddings, headers=RATE_LIMITS)
    if not body.get("stream"):
        full = {"/chat/completions": wire.chat_completion_body, "/responses": wire.response_body,
                "/completions": wire.completion_body}[endpoint]
        return wire.Reply.json(full(text, usage=USAGE), headers=RATE_LIMITS)
    if endpoint == "/responses":  # its last event always carries usage
        return wire.Reply.stream(wire.responses_stream(TOKENS, usage=USAGE), headers=RATE_LIMITS)
    streamed = {"/chat/completions": wire.chat_stream, "/completions": wire.completion_stream}[endpoint]
    return wire.Reply.stream(streamed(TOKENS, usage=usage), headers=RATE_LIMITS)


def client(server: wire.LoopbackServer, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-test", base_url=server.base_url, **{"max_retries": 0, **options})


def async_client(server: wire.LoopbackServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="sk-test", base_url=server.base_url, max_retries=0)


# --- chat completions -------------------------------------------------------------------------------------------


def chat(server: wire.LoopbackServer) -> Any:
    return client(server).chat.completions.create(model=MODEL, messages=MESSAGES)


async def chat_async(server: wire.LoopbackServer) -> Any:
    async with async_client(server) as client:
        return await client.chat.completions.create(model=MODEL, messages=MESSAGES)


def chat_stream(server: wire.LoopbackServer) -> Any:
    return list(client(server).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))


async def chat_stream_async(server: wire.LoopbackServer) -> Any:
    async with async_client(server) as client:
        stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        return [chunk async for chunk in stream]


def chat_stream_asking_usage(server: wire.LoopbackServer) -> Any:
    return list(client(server).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,
                                                       stream_options={"include_usage": True}))


def chat_stream_closed_early(server: wire.LoopbackServer) -> Any:
    stream = client(server).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    first = list(itertools.islice(stream, 2))
    stream.close()
    return first


def chat_stream_helper(server: wire.LoopbackServer) -> Any:
    with client(server).chat.completions.stream(model=MODEL, messages=MESSAGES) as stream:
        return {"events": list(stream), "final": stream.get_final_completion()}


async def chat_stream_helper_async(server: wire.LoopbackServer) -> Any:
    async with (
        async_client(server) as client,
        client.chat.completions.stream(model=MODEL, messages=MESSAGES) as stream,
    ):
        return {"events": [event async for event in stream], "final": await stream.get_final_completion()}


def chat_parse(server: wire.LoopbackServer) -> Any:
    return client(server).chat.completions.parse(model=MODEL, messages=MESSAGES)


async def chat_parse_async(server: wire.LoopbackServer) -> Any:
    async with async_client(server) as client:
        return await client.chat.completions.parse(model=MODEL, messages=MESSAGES)


def chat_raw(server: wire.LoopbackServer) -> Any:
    response = client(server).chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES)
    return {"status": response.status_code, "parsed": response.parse()}


def chat_raw_stream(server: wire.LoopbackServer) -> Any:
    response = client(server).chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, stream=True)
    return list(response.parse())


def chat_streaming_response(server: wire.LoopbackServer) -> Any:
    with client(server).chat.completions.with_streaming_response.create(model=MODEL, messages=MESSAGES) as response:
        return response.parse()


def chat_streaming_response_stream(server: wire.LoopbackServer) -> Any:
    completions = client(server).chat.completions
    with completions.with_streaming_response.create(model=MODEL, messages=MESSAGES, stream=True) as response:
        return list(response.parse())


def chat_retried(server: wire.LoopbackServer) -> Any:
    return client(server, max_retries=1).chat.completions.create(
        model=MODEL, messages=MESSAGES, extra_headers={THROTTLE_FIRST_TRY: "1"})


def chat_refused(server: wire.LoopbackServer) -> Any:
    try:
        client(server).chat.completions.create(model=UNKNOWN_MODEL, messages=MESSAGES)
    except openai.BadRequestError as error:
        return {"raised": type(error).__name__, "status": error.status_code}
    raise AssertionError("no BadRequestError")


# --- responses, completions, embeddings -------------------------------------------------------------------------


def responses(server: wire.LoopbackServer) -> Any:
    return client(server).responses.create(model=MODEL, input="Say hello world")


def responses_stream(server: wire.LoopbackServer) -> Any:
    return list(client(server).responses.create(model=MODEL, input="Say hello world", stream=True))


def responses_stream_helper(server: wire.LoopbackServer) -> Any:
    with client(server).responses.stream(model=MODEL, input="Say hello world") as stream:
        return {"events": list(stream), "final": stream.get_final_response()}


def responses_parse(server: wire.LoopbackServer) -> Any:
    return client(server).responses.parse(model=MODEL, input="Say hello world")


def completions(server: wire.LoopbackServer) -> Any:
    return client(server).completions.create(model=wire.COMPLETION_MODEL, prompt="Say hello")


def completions_stream(server: wire.LoopbackServer) -> Any:
    return list(client(server).completions.create(model=wire.COMPLETION_MODEL, prompt="Say hello", stream=True))


def embeddings(server: wire.LoopbackServer) -> Any:
    return client(server).embeddings.create(model=wire.EMBEDDING_MODEL, input=["a", "b"])


# --- what each must record --------------------------------------------------------------------------------------

RATE_LIMIT_HEADROOM = {
    sc.RATE_LIMIT_REMAINING_PREFIX + sc.RATE_LIMIT_REQUESTS: 499,
    sc.RATE_LIMIT_LIMIT_PREFIX + sc.RATE_LIMIT_REQUESTS: 500,
    sc.RATE_LIMIT_REMAINING_PREFIX + sc.RATE_LIMIT_TOKENS: 199_000,
    sc.RATE_LIMIT_LIMIT_PREFIX + sc.RATE_LIMIT_TOKENS: 200_000,
}
CHAT = Span(sc.OP_CHAT, MODEL, sc.PROVIDER_OPENAI, stream=False, response_model=wire.CHAT_MODEL,
            response_id="chatcmpl-abc", input_tokens=USAGE.input, output_tokens=USAGE.output, finish_reasons=("stop",),
            more=RATE_LIMIT_HEADROOM)
CHAT_STREAM = dataclasses.replace(CHAT, stream=True)
# the caller reads the raw HTTP response: usage cannot be asked for behind its back, so no token counts
CHAT_RAW_STREAM = dataclasses.replace(CHAT_STREAM, input_tokens=None, output_tokens=None)
RESPONSE = dataclasses.replace(CHAT, response_id="resp_abc", finish_reasons=("completed",))
COMPLETION = dataclasses.replace(CHAT, operation=sc.OP_TEXT_COMPLETION, model=wire.COMPLETION_MODEL,
                                 response_model=wire.COMPLETION_MODEL, response_id="cmpl-abc")

SCENARIOS = (
    Scenario("chat.create", chat, CHAT),
    Scenario("chat.create async", chat_async, CHAT),
    Scenario("chat.create stream", chat_stream, CHAT_STREAM),
    Scenario("chat.create stream async", chat_stream_async, CHAT_STREAM),
    Scenario("chat.create stream, caller asks for usage", chat_stream_asking_usage, CHAT_STREAM),
    Scenario("chat.create stream closed after 2 chunks", chat_stream_closed_early,
             dataclasses.replace(CHAT_RAW_STREAM, finish_reasons=None, error=sc.ERROR_CANCELLED)),
    Scenario("chat.stream()", chat_stream_helper, CHAT_STREAM),
    Scenario("chat.stream() async", chat_stream_helper_async, CHAT_STREAM),
    Scenario("chat.parse()", chat_parse, CHAT),
    Scenario("chat.parse() async", chat_parse_async, CHAT),
    Scenario("chat with_raw_response", chat_raw, CHAT),
    Scenario("chat with_raw_response stream", chat_raw_stream, CHAT_RAW_STREAM),
    Scenario("chat with_streaming_response", chat_streaming_response, CHAT),
    Scenario("chat with_streaming_response stream", chat_streaming_response_stream, CHAT_RAW_STREAM),
    Scenario("chat.create retried after a 429", chat_retried, dataclasses.replace(CHAT, retries=1)),
    Scenario("chat.create refused with a 400", chat_refused,
             Span(sc.OP_CHAT, UNKNOWN_MODEL, sc.PROVIDER_OPENAI, stream=False, error="BadRequestError",
                  more=RATE_LIMIT_HEADROOM)),
    Scenario("responses.create", responses, RESPONSE),
    Scenario("responses.create stream", responses_stream, dataclasses.replace(RESPONSE, stream=True)),
    Scenario("responses.stream()", responses_stream_helper, dataclasses.replace(RESPONSE, stream=True)),
    Scenario("responses.parse()", responses_parse, RESPONSE),
    Scenario("completions.create", completions, COMPLETION),
    Scenario("completions.create stream", completions_stream, dataclasses.replace(COMPLETION, stream=True)),
    Scenario("embeddings.create", embeddings,
             Span(sc.OP_EMBEDDINGS, wire.EMBEDDING_MODEL, sc.PROVIDER_OPENAI, stream=False,
                  response_model=wire.EMBEDDING_MODEL, input_tokens=EMBEDDING_TOKENS, more=RATE_LIMIT_HEADROOM)),
)

if __name__ == "__main__":
    main(PROVIDER, SCENARIOS, answer)
