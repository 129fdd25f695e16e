"""Fake Amazon Bedrock at the wire: the AWS event-stream binary framing and bedrock-runtime's JSON shapes, served by
`wire.LoopbackServer`, so real boto3 signs, sends and parses every byte.

* `message()`: one event-stream message (the framing lives in `otel_llm._eventstream`); `event()`, `exception()`
  and `chunk()` build the kinds Bedrock sends.
* `converse_stream()`, `converse_body()`: converse's events and result.
* `FORMATS`: `invoke_model` request bodies, response bodies and stream chunks of each model family.
* `stream_reply()`, `invoke_reply()`, `converse_reply()`, `error_reply()`: scripted HTTP responses; `client()`:
  a bedrock-runtime client with dummy credentials pointed at a server.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import wire
from botocore.config import Config

from otel_llm import _eventstream
from otel_llm._eventstream import message  # also part of this module: tests frame odd messages with it

Json = dict[str, Any]

REGION = "us-east-1"
REQUEST_ID = "5f0e1c3a-8b2d-4e6f-9a7b-1c2d3e4f5a6b"
# Bedrock pads every event payload with a random "p" string so sizes do not give the content away; a fixed one here
PADDING = "abcdefghijklmnopqrstuvwxyzABCDEF"
ERROR_TYPE_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
EVENT_STREAM = "application/vnd.amazon.eventstream"


@dataclass(frozen=True)
class Tokens:
    """Token counts as Bedrock reports them: `input` leaves out the cache reads and writes, reported apart."""

    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0


# --- event-stream framing ---------------------------------------------------------------------------------------


def event(event_type: str, body: Json) -> bytes:
    return _eventstream.event(event_type, _compact({**body, "p": PADDING}))


def exception(exception_type: str, text: str) -> bytes:
    """A mid-stream exception event; `exception_type` is the stream member's name, e.g. `throttlingException`."""
    headers = {":exception-type": exception_type, ":content-type": "application/json", ":message-type": "exception"}
    return message(headers, _compact({"message": text}))


def chunk(payload: Json) -> bytes:
    """One invoke_model_with_response_stream event: the model's own JSON, base64-encoded in a `chunk` PayloadPart."""
    return event("chunk", {"bytes": base64.b64encode(_compact(payload)).decode()})


def _compact(data: Json) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


# --- converse ---------------------------------------------------------------------------------------------------


def converse_stream(tokens: list[str], *, usage: Tokens, latency_ms: int = 0, stop_reason: str = "end_turn",
                    error: bytes | None = None) -> list[bytes]:
    """converse_stream's events for one text block: messageStart, a contentBlockDelta per token, contentBlockStop,
    messageStop and metadata (usage and Bedrock's latency). With `error`, that exception event replaces everything
    after the tokens."""
    events = [event("messageStart", {"role": "assistant"}),
              *(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": token}}) for token in tokens)]
    if error is not None:
        return [*events, error]
    return [*events,
            event("contentBlockStop", {"contentBlockIndex": 0}),
            event("messageStop", {"stopReason": stop_reason}),
            event("metadata", {"usage": _converse_usage(usage), "metrics": {"latencyMs": latency_ms}})]


def converse_body(text: str, *, usage: Tokens, latency_ms: int, stop_reason: str = "end_turn") -> Json:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": stop_reason,
        "usage": _converse_usage(usage),
        "metrics": {"latencyMs": latency_ms},
    }


def _converse_usage(usage: Tokens) -> Json:
    return {
        "inputTokens": usage.input,
        "outputTokens": usage.output,
        "totalTokens": usage.input + usage.output + usage.cache_read + usage.cache_write,
        "cacheReadInputTokens": usage.cache_read,
        "cacheWriteInputTokens": usage.cache_write,
    }


# --- invoke_model body formats ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    """One model family's invoke_model JSON: the request for a prompt, the response body, and the stream chunks
    (before Bedrock adds its `amazon-bedrock-invocationMetrics` to the last one)."""

    name: str
    model_id: str
    request: Callable[[str], Json]
    body: Callable[[list[str], Tokens], Json]
    stream: Callable[[list[str], Tokens], list[Json]]
    stop_reason: str
    usage_in_body: bool  # does the model's own JSON carry token counts (else only Bedrock's headers and metrics)


CLAUDE_MODEL = "claude-3-5-haiku-20241022"
CLAUDE_ID = "msg_bdrk_01Kx7pWmFf3sH1yJ8cN2qR4t"


def _claude_usage(usage: Tokens, output: int) -> Json:
    return {"input_tokens": usage.input, "cache_creation_input_tokens": usage.cache_write,
            "cache_read_input_tokens": usage.cache_read, "output_tokens": output}


def _claude_message(text: str, usage: Tokens, output: int, stop_reason: str | None) -> Json:
    content = [{"type": "text", "text": text}] if text else []
    return {"id": CLAUDE_ID, "type": "message", "role": "assistant", "model": CLAUDE_MODEL, "content": content,
            "stop_reason": stop_reason, "stop_sequence": None, "usage": _claude_usage(usage, output)}


def _claude_stream(tokens: list[str], usage: Tokens) -> list[Json]:
    return [
        {"type": "message_start", "message": _claude_message("", usage, 1, None)},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}} for t in tokens),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": usage.output}},
        {"type": "message_stop"},
    ]


def _last(tokens: list[str], index: int, value: Any, other: Any = None) -> Any:
    """`value` on the last token's chunk, `other` before it."""
    return value if index == len(tokens) - 1 else other


FORMATS: tuple[Format, ...] = (
    Format(
        "claude-messages", f"us.anthropic.{CLAUDE_MODEL}-v1:0",
        lambda prompt: {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 256, "system": "Be brief.",
                        "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
                        "temperature": 0.5, "top_k": 40},
        lambda tokens, usage: _claude_message("".join(tokens), usage, usage.output, "end_turn"),
        _claude_stream, "end_turn", True,
    ),
    Format(
        "claude-text", "anthropic.claude-v2:1",
        lambda prompt: {"prompt": f"\n\nHuman: {prompt}\n\nAssistant:", "max_tokens_to_sample": 200,
                        "temperature": 0.5, "stop_sequences": ["\n\nHuman:"]},
        lambda tokens, usage: {"type": "completion", "completion": "".join(tokens), "stop_reason": "stop_sequence",
                               "stop": "\n\nHuman:"},
        lambda tokens, usage: [*({"completion": t, "stop_reason": None, "stop": None} for t in tokens),
                               {"completion": "", "stop_reason": "stop_sequence", "stop": "\n\nHuman:"}],
        "stop_sequence", False,
    ),
    Format(
        "llama", "meta.llama3-1-8b-instruct-v1:0",
        lambda prompt: {"prompt": f"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|>",
                        "max_gen_len": 128, "temperature": 0.5, "top_p": 0.9},
        lambda tokens, usage: {"generation": "".join(tokens), "prompt_token_count": usage.input,
                               "generation_token_count": usage.output, "stop_reason": "stop"},
        lambda tokens, usage: [
            *({"generation": t, "prompt_token_count": usage.input if i == 0 else None,
               "generation_token_count": i + 1, "stop_reason": None} for i, t in enumerate(tokens)),
            {"generation": "", "prompt_token_count": None, "generation_token_count": usage.output,
             "stop_reason": "stop"}],
        "stop", True,
    ),
    Format(
        "titan", "amazon.titan-text-express-v1",
        lambda prompt: {"inputText": prompt, "textGenerationConfig": {"maxTokenCount": 256, "temperature": 0.5,
                                                                      "topP": 0.9, "stopSequences": []}},
        lambda tokens, usage: {"inputTextTokenCount": usage.input, "results": [
            {"tokenCount": usage.output, "outputText": "".join(tokens), "completionReason": "FINISH"}]},
        lambda tokens, usage: [
            {"outputText": t, "index": 0, "totalOutputTextTokenCount": _last(tokens, i, usage.output, i + 1),
             "completionReason": _last(tokens, i, "FINISH"), "inputTextTokenCount": usage.input if i == 0 else None}
            for i, t in enumerate(tokens)],
        "FINISH", True,
    ),
    Format(
        "nova", "us.amazon.nova-lite-v1:0",
        lambda prompt: {"schemaVersion": "messages-v1", "system": [{"text": "Be brief."}],
                        "messages": [{"role": "user", "content": [{"text": prompt}]}],
                        "inferenceConfig": {"maxTokens": 256, "temperature": 0.5, "topP": 0.9, "topK": 20}},
        lambda tokens, usage: {
            "output": {"message": {"role": "assistant", "content": [{"text": "".join(tokens)}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": usage.input, "outputTokens": usage.output,
                      "totalTokens": usage.input + usage.output + usage.cache_read + usage.cache_write,
                      "cacheReadInputTokenCount": usage.cache_read, "cacheWriteInputTokenCount": usage.cache_write}},
        lambda tokens, usage: [
            {"messageStart": {"role": "assistant"}},
            *({"contentBlockDelta": {"delta": {"text": t}, "contentBlockIndex": 0}} for t in tokens),
            {"contentBlockStop": {"contentBlockIndex": 0}},
            {"messageStop": {"stopReason": "end_turn"}},
            {"metadata": {"usage": {"inputTokens": usage.input, "outputTokens": usage.output}, "metrics": {},
                          "trace": {}}}],
        "end_turn", True,
    ),
    Format(
        "cohere-generate", "cohere.command-text-v14",
        lambda prompt: {"prompt": prompt, "max_tokens": 100, "temperature": 0.5, "p": 0.9, "k": 40},
        lambda tokens, usage: {"id": "4c9b2d7e-cohere", "prompt": "...", "generations": [
            {"id": "gen-1", "text": "".join(tokens), "finish_reason": "COMPLETE"}]},
        lambda tokens, usage: [*({"text": t, "is_finished": False} for t in tokens),
                               {"is_finished": True, "finish_reason": "COMPLETE"}],
        "COMPLETE", False,
    ),
    Format(
        "cohere-chat", "cohere.command-r-v1:0",
        lambda prompt: {"message": prompt, "chat_history": [{"role": "USER", "message": "Hi"},
                                                            {"role": "CHATBOT", "message": "Hello"}],
                        "preamble": "Be brief.", "max_tokens": 100, "temperature": 0.5, "p": 0.9, "seed": 7},
        lambda tokens, usage: {"response_id": "r-1", "text": "".join(tokens), "generation_id": "g-1",
                               "chat_history": [], "finish_reason": "COMPLETE"},
        lambda tokens, usage: [
            {"is_finished": False, "event_type": "stream-start", "generation_id": "g-1"},
            *({"is_finished": False, "event_type": "text-generation", "text": t} for t in tokens),
            {"is_finished": True, "event_type": "stream-end", "finish_reason": "COMPLETE",
             "response": {"response_id": "r-1", "text": "".join(tokens), "generation_id": "g-1"}}],
        "COMPLETE", False,
    ),
    Format(
        "mistral", "mistral.mistral-7b-instruct-v0:2",
        lambda prompt: {"prompt": f"<s>[INST] {prompt} [/INST]", "max_tokens": 200, "temperature": 0.5,
                        "top_p": 0.9, "top_k": 50, "stop": ["</s>"]},
        lambda tokens, usage: {"outputs": [{"text": "".join(tokens), "stop_reason": "stop"}]},
        lambda tokens, usage: [*({"outputs": [{"text": t, "stop_reason": None}]} for t in tokens),
                               {"outputs": [{"text": "", "stop_reason": "stop"}]}],
        "stop", False,
    ),
    Format(
        "mistral-chat", "mistral.mistral-large-2407-v1:0",
        lambda prompt: {"messages": [{"role": "user", "content": prompt}], "max_tokens": 200, "temperature": 0.5,
                        "top_p": 0.9},
        lambda tokens, usage: {"id": "m-1", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "".join(tokens)}, "stop_reason": "stop"}]},
        lambda tokens, usage: [
            *({"choices": [{"index": 0, "message": {"role": "assistant", "content": t}, "stop_reason": None}]}
              for t in tokens),
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "stop_reason": "stop"}]}],
        "stop", False,
    ),
)
FORMAT = {f.name: f for f in FORMATS}


def invocation_metrics(usage: Tokens, *, latency_ms: int, first_byte_ms: int) -> Json:
    """What Bedrock adds to the last chunk of every invoke_model_with_response_stream."""
    return {"inputTokenCount": usage.input, "outputTokenCount": usage.output, "invocationLatency": latency_ms,
            "firstByteLatency": first_byte_ms, "cacheReadInputTokenCount": usage.cache_read,
            "cacheWriteInputTokenCount": usage.cache_write}


def with_invocation_metrics(chunks: list[Json], metrics: Json | None) -> list[Json]:
    """A stream's chunks as Bedrock sends them: its `metrics` (when given) merged into the last chunk's JSON."""
    if metrics is None:
        return chunks
    return [*chunks[:-1], {**chunks[-1], "amazon-bedrock-invocationMetrics": metrics}]


def invoke_stream(chunks: list[Json], metrics: Json | None) -> list[bytes]:
    """The chunk events of an invoke_model_with_response_stream."""
    return [chunk(payload) for payload in with_invocation_metrics(chunks, metrics)]


def invocation_headers(usage: Tokens, *, latency_ms: int) -> dict[str, str]:
    """Bedrock's headers on an invoke_model response."""
    return {
        "X-Amzn-Bedrock-Input-Token-Count": str(usage.input),
        "X-Amzn-Bedrock-Output-Token-Count": str(usage.output),
        "X-Amzn-Bedrock-Cache-Read-Input-Token-Count": str(usage.cache_read),
        "X-Amzn-Bedrock-Cache-Write-Input-Token-Count": str(usage.cache_write),
        "X-Amzn-Bedrock-Invocation-Latency": str(latency_ms),
    }


# --- replies and the client -------------------------------------------------------------------------------------


def stream_reply(events: list[bytes], *, headers: dict[str, str] | None = None, headers_delay: float = 0.0,
                 delays: list[float] | None = None, drop_after: int | None = None) -> wire.Reply:
    """A 200 event stream, one message per network write."""
    return wire.Reply(200, events, {"Content-Type": EVENT_STREAM, "X-Amzn-RequestId": REQUEST_ID, **(headers or {})},
                      headers_delay, delays, drop_after)


def invoke_reply(body: Json, headers: dict[str, str] | None = None) -> wire.Reply:
    return wire.Reply(200, _compact(body), {"Content-Type": "application/json", "X-Amzn-RequestId": REQUEST_ID,
                                            **(headers or {})})


def converse_reply(body: Json, request_id: str = REQUEST_ID) -> wire.Reply:
    return wire.Reply(200, _compact(body), {"Content-Type": "application/json", "X-Amzn-RequestId": request_id})


def error_reply(status: int, code: str, text: str, request_id: str = REQUEST_ID) -> wire.Reply:
    """An error as Bedrock sends it: the code in `x-amzn-ErrorType`, the message in the JSON body."""
    headers = {"Content-Type": "application/json", "X-Amzn-RequestId": request_id,
               "X-Amzn-ErrorType": code + ERROR_TYPE_SUFFIX}
    return wire.Reply(status, _compact({"message": text}), headers)


def throttled(request_id: str = REQUEST_ID) -> wire.Reply:
    return error_reply(429, "ThrottlingException", "Too many requests, please wait before trying again.", request_id)


def endpoint_url(server: wire.LoopbackServer) -> str:
    return server.base_url.removesuffix("/v1")


# one session for every client: it loads each service's model once (a new session takes ~100 ms per client)
_SESSION = boto3.session.Session()


def client(server: wire.LoopbackServer, *, attempts: int = 1, service: str = "bedrock-runtime") -> Any:
    """A real boto3 client on `server`: dummy credentials, so requests are signed as usual. `attempts` bounds
    botocore's standard retry mode (1: no retries)."""
    return _SESSION.client(
        service, endpoint_url=endpoint_url(server), region_name=REGION, aws_access_key_id="test",
        aws_secret_access_key="test", config=Config(retries={"total_max_attempts": attempts, "mode": "standard"}))
