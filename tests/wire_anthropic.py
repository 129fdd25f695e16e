"""Fake Anthropic at the wire: Messages API bodies, SSE streams and errors as the API sends them, and the same stream
events in the AWS event-stream framing that Bedrock's ``invoke-with-response-stream`` uses.

Streams are built in two steps: ``message_events`` gives the events as (name, JSON object) pairs, ``sse`` and
``event_stream`` write them to bytes, one element per network write. ``wire.Reply``, ``wire.mock_client`` and
``wire.LoopbackServer`` carry them.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import wire

from otel_llm import _eventstream

Json = dict[str, Any]

MODEL = "claude-haiku-4-5-20251001"
MESSAGE_ID = "msg_01XFDUDYJgAACzvnptvVoYEL"
REQUEST_ID = "req_011CSHoEeqs5C35K2UUqR7Fy"
TOOL_USE_ID = "toolu_01T1x1fJ34qAmk2tNTrN7Up6"
TOOL_NAME = "get_weather"
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
REDACTED_THINKING = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YYgQ3vJLb9M"
PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # the API writes this one with spaces


@dataclass(frozen=True)
class Usage:
    """Token counts as Anthropic reports them: `input` leaves out the cache reads and writes."""

    input: int
    output: int
    cache_read: int = 0
    cache_creation: int = 0
    thinking: int | None = None  # output_tokens_details.thinking_tokens, sent when the model thought


def message_events(
    blocks: list[tuple[str, list[str]]],
    *,
    usage: Usage,
    model: str = MODEL,
    id: str = MESSAGE_ID,
    stop_reason: str | None = None,
    cumulative_input: bool = False,
) -> list[tuple[str, Json]]:
    """The events of one streamed Message whose content is `blocks`: ("text" | "thinking" | "redacted_thinking" |
    "tool_use", deltas).

    `message_start` carries the input counts and a placeholder `output_tokens: 1`; each block opens empty, gets one
    delta per element (a tool_use block first gets the empty `partial_json` the API sends, a thinking block ends with
    its `signature_delta`) and stops; `message_delta` carries `stop_reason` (default "end_turn", or "tool_use" when a
    tool is called) and the final output count, plus the input counts again when `cumulative_input` is set.
    A `ping` follows the first `content_block_start`, where the API sends it.
    """
    start_usage = {**_input_usage(usage), "output_tokens": 1, "service_tier": "standard"}
    message: Json = {"id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                     "stop_reason": None, "stop_sequence": None, "usage": start_usage}
    events: list[tuple[str, Json]] = [("message_start", {"type": "message_start", "message": message})]
    for index, (kind, deltas) in enumerate(blocks):
        block: Json
        if kind == "text":
            block, field, delta_type = {"type": "text", "text": ""}, "text", "text_delta"
        elif kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
            field, delta_type = "thinking", "thinking_delta"
        elif kind == "redacted_thinking":  # whole at its start: no deltas
            block, field, delta_type = {"type": "redacted_thinking", "data": REDACTED_THINKING}, "", ""
        else:
            block = {"type": "tool_use", "id": TOOL_USE_ID, "name": TOOL_NAME, "input": {}}
            field, delta_type = "partial_json", "input_json_delta"
            deltas = ["", *deltas]
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        if index == 0:
            events.append(("ping", {"type": "ping"}))
        for text in deltas:
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": delta_type, field: text}}))
        if kind == "thinking":
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "signature_delta", "signature": SIGNATURE}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    final_usage: Json = {**(_input_usage(usage) if cumulative_input else {}), "output_tokens": usage.output}
    if usage.thinking is not None:
        final_usage["output_tokens_details"] = {"thinking_tokens": usage.thinking}
    stop = stop_reason or ("tool_use" if any(kind == "tool_use" for kind, _ in blocks) else "end_turn")
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": final_usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def text_events(tokens: list[str], *, usage: Usage, **options: Any) -> list[tuple[str, Json]]:
    return message_events([("text", tokens)], usage=usage, **options)


def sse(events: list[tuple[str, Json]]) -> list[bytes]:
    """One SSE event per element, `event:` then compact `data:`, as the Messages API writes them."""
    return [PING if name == "ping" else wire.sse(data, event=name) for name, data in events]


def error_event(error_type: str = "overloaded_error", message: str = "Overloaded") -> bytes:
    """The `error` event the API sends mid-stream (the HTTP status was already 200)."""
    return wire.sse(error_body(error_type, message), event="error")


def message_body(
    text: str, *, usage: Usage, model: str = MODEL, id: str = MESSAGE_ID, stop_reason: str = "end_turn"
) -> Json:
    """A non-streamed Message with one text block."""
    usage_body: Json = {**_input_usage(usage), "output_tokens": usage.output, "service_tier": "standard"}
    if usage.thinking is not None:
        usage_body["output_tokens_details"] = {"thinking_tokens": usage.thinking}
    return {"id": id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": stop_reason, "stop_sequence": None,
            "usage": usage_body}


def error_body(error_type: str, message: str) -> Json:
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": REQUEST_ID}


def ratelimit_headers(**resources: tuple[int, int]) -> dict[str, str]:
    """`anthropic-ratelimit-*` headers, e.g. `requests=(limit, remaining)`; names use `-` for `_`
    (`input_tokens` -> `input-tokens`), resets are RFC 3339 times as the API sends them."""
    headers: dict[str, str] = {}
    for resource, (limit, remaining) in resources.items():
        prefix = f"anthropic-ratelimit-{resource.replace('_', '-')}"
        headers[f"{prefix}-limit"] = str(limit)
        headers[f"{prefix}-remaining"] = str(remaining)
        headers[f"{prefix}-reset"] = "2025-01-01T00:00:30Z"
    return headers


def stream_reply(events: list[tuple[str, Json]], **options: Any) -> wire.Reply:
    headers = {"request-id": REQUEST_ID, **options.pop("headers", {})}
    return wire.Reply.stream(sse(events), headers=headers, **options)


def json_reply(body: Json, *, status: int = 200, headers: dict[str, str] | None = None,
               headers_delay: float = 0.0) -> wire.Reply:
    """A compact JSON reply, as the API writes it, with its `request-id`."""
    return wire.Reply(status, json.dumps(body, separators=(",", ":")).encode(),
                      {"content-type": "application/json", "request-id": REQUEST_ID, **(headers or {})},
                      headers_delay)


def rate_limited(retry_after: float) -> wire.Reply:
    """A 429 with `retry-after` (the API sends whole seconds; tests send fractions, which the SDK honors) and the
    exhausted request budget."""
    headers = {"retry-after": f"{retry_after:g}",
               **ratelimit_headers(requests=(50, 0), tokens=(90_000, 88_000), input_tokens=(80_000, 79_000),
                                   output_tokens=(10_000, 9_000))}
    return json_reply(error_body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate "
                                 "limit"), status=429, headers=headers)


def overloaded() -> wire.Reply:
    return json_reply(error_body("overloaded_error", "Overloaded"), status=529)


def event_stream(events: list[tuple[str, Json]]) -> list[bytes]:
    """Bedrock's `invoke-with-response-stream` body: one AWS event-stream frame per event (pings are not sent),
    each a `chunk` whose payload holds the event's JSON in base64, with the `p` padding Bedrock adds."""
    frames = []
    for name, data in events:
        if name == "ping":
            continue
        payload = {"bytes": base64.b64encode(json.dumps(data, separators=(",", ":")).encode()).decode(),
                   "p": "abcdefghij"}
        frames.append(_eventstream.event("chunk", json.dumps(payload, separators=(",", ":")).encode()))
    return frames


def _input_usage(usage: Usage) -> Json:
    return {"input_tokens": usage.input, "cache_creation_input_tokens": usage.cache_creation,
            "cache_read_input_tokens": usage.cache_read}
