"""The boto3 ``bedrock-runtime`` client, and aiobotocore's: what its calls, results and stream events mean, as plain
values. No spans, no meters.

Covers ``converse``, ``converse_stream``, ``invoke_model`` and ``invoke_model_with_response_stream`` on every client,
made before or after ``instrument()``: botocore builds client classes at run time, so the patch sits on the method
they all call, ``BaseClient._make_api_call`` (aiobotocore's ``AioBaseClient._make_api_call``, a coroutine function),
and lets every other service and operation through untouched.
``invoke_model`` JSON is read by its shape: Anthropic Claude (messages and text completions), Meta Llama, Amazon
Titan and Nova, Cohere (generate and chat), Mistral (completions and chat). Bedrock's own latency figures
(``metrics.latencyMs``, the ``x-amzn-bedrock-invocation-latency`` header, a stream's
``amazon-bedrock-invocationMetrics``) are kept beside ours, and error codes become ``error.type``.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import io
import json
import re
import sys
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import wrapt
from botocore.client import BaseClient
from botocore.eventstream import EventStream
from botocore.exceptions import ClientError
from botocore.response import StreamingBody

from otel_llm import _content as ct
from otel_llm import _semconv as sc
from otel_llm._calls import Kind, async_call, current_operation, hook, named_after, sync_call
from otel_llm._content import Message, Output, Part
from otel_llm._operation import Request
from otel_llm._patching import Provider, Target
from otel_llm._redact import bearer_secrets
from otel_llm._safety import report_failure, reraise_if_signalled
from otel_llm._stream import CONTENT, DONE, OTHER, Transparent
from otel_llm.providers import _claude
from otel_llm.providers._values import count, field, number, parameter, prompt_chars, text_counter

if TYPE_CHECKING:
    from otel_llm._calls import Wrapper
    from otel_llm._operation import Operation
    from otel_llm._settings import Settings
    from otel_llm._telemetry import Telemetry

_SERVICE = "bedrock-runtime"
# the session token as a SigV4 error's canonical request lists it among the signed headers
_SESSION_TOKEN = re.compile(r"x-amz-security-token:(\S+)", re.IGNORECASE)

# request parameters sit in the body itself or in a config object inside it (converse, Titan, Nova)
_CONFIG_KEYS = ("inferenceConfig", "textGenerationConfig", "additionalModelRequestFields")
_PARAMETERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (sc.REQUEST_MAX_TOKENS,
     ("max_tokens", "maxTokens", "max_tokens_to_sample", "max_gen_len", "maxTokenCount", "max_new_tokens")),
    (sc.REQUEST_TEMPERATURE, ("temperature",)),
    (sc.REQUEST_TOP_P, ("top_p", "topP", "p")),
    (sc.REQUEST_TOP_K, ("top_k", "topK", "k")),
    (sc.REQUEST_SEED, ("seed",)),
)
_STOP_KEYS = ("stop_sequences", "stopSequences", "stop")
# where input text sits: converse's arguments and every body format's top level; then inside messages and blocks
_PROMPT_KEYS = ("system", "messages", "prompt", "inputText", "message", "chat_history", "preamble", "texts")
# tool calls passed back: a toolUse's input, and a toolResult's json blocks, are JSON the model reads
_text_chars = text_counter("content", "text", "message", "toolResult", "toolUse", json_keys=("input", "json"))

_TOKEN_HEADERS = ("x-amzn-bedrock-input-token-count", "x-amzn-bedrock-output-token-count",
                  "x-amzn-bedrock-cache-read-input-token-count", "x-amzn-bedrock-cache-write-input-token-count")
_LATENCY_HEADER = "x-amzn-bedrock-invocation-latency"
_REQUEST_ID_HEADERS = ("x-amzn-requestid", "x-amzn-request-id", "x-amz-request-id")
_INVOCATION_METRICS = "amazon-bedrock-invocationMetrics"

_clock = time.perf_counter_ns


# --- request side ----------------------------------------------------------------------------------------------


def _request_parameters(body: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    # embedding models': the dimensions asked for (Titan), the encodings (Cohere's embedding types, Titan's)
    dimensions = parameter(sc.EMBEDDINGS_DIMENSION_COUNT, body.get("dimensions"))
    if dimensions is not None:
        attributes[sc.EMBEDDINGS_DIMENSION_COUNT] = dimensions
    encodings = body.get("embedding_types", body.get("embeddingTypes"))
    if isinstance(encodings, list) and encodings and all(isinstance(kind, str) for kind in encodings):
        attributes[sc.REQUEST_ENCODING_FORMATS] = encodings
    for source in (body, *(body[key] for key in _CONFIG_KEYS if isinstance(body.get(key), Mapping))):
        for name, keys in _PARAMETERS:
            for key in keys:
                given = source.get(key)
                if given is not None and (value := parameter(name, given)) is not None:
                    attributes.setdefault(name, value)
        for key in _STOP_KEYS:
            stop = source.get(key)
            if isinstance(stop, str):
                stop = [stop]
            if isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
                attributes.setdefault(sc.REQUEST_STOP_SEQUENCES, stop)
    return attributes


_MEDIA = (("image", sc.MODALITY_IMAGE), ("document", sc.MODALITY_DOCUMENT), ("video", sc.MODALITY_VIDEO))


def _part(block: Any) -> Part:
    """A converse content block (one key says what it is), or a Claude body's block (a ``type`` says it)."""
    if not isinstance(block, Mapping):
        return ct.other(None)
    if "type" in block:
        return _claude.part(block)
    if "text" in block:
        return ct.text(block["text"])
    if "toolUse" in block:
        tool = block["toolUse"]
        return ct.tool_call(field(tool, "toolUseId"), field(tool, "name"), ct.plain(field(tool, "input")))
    if "toolResult" in block:
        result = block["toolResult"]
        return ct.tool_call_response(field(result, "toolUseId"), [
            ct.plain(item["json"]) if isinstance(item, Mapping) and "json" in item else _part(item)
            for item in ct.listed(field(result, "content"))])
    if "reasoningContent" in block:
        return ct.reasoning(field(field(block["reasoningContent"], "reasoningText"), "text"))
    if "guardContent" in block:
        return ct.text(field(field(block["guardContent"], "text"), "text"))
    for key, modality in _MEDIA:
        media = block.get(key)
        if isinstance(media, Mapping):
            location = field(field(media.get("source"), "s3Location"), "uri")
            image_format = media.get("format")
            mime = f"image/{image_format}" if key == "image" and isinstance(image_format, str) else None
            return ct.uri(modality, location, mime) if isinstance(location, str) else ct.blob(modality, mime)
    return ct.other(next(iter(block), None))


def _parts(content: Any) -> list[Part]:
    """A message's or the system's content: a string, or blocks (cache points are no content)."""
    if isinstance(content, str):
        return [ct.text(content)]
    if not isinstance(content, (list, tuple)):  # botocore sends a tuple as it sends a list
        return []
    return [_part(block) for block in content if not (isinstance(block, Mapping) and "cachePoint" in block)]


# Cohere's chat-history roles, as the conventions name them
_COHERE_ROLES: Mapping[str, str] = {"USER": sc.ROLE_USER, "CHATBOT": sc.ROLE_ASSISTANT, "SYSTEM": "system"}


def _input_messages(body: Mapping[str, Any]) -> list[Message]:
    """converse's messages and every invoke_model body's: messages (Claude, Nova, Mistral chat), Cohere's chat
    history, and a prompt's text."""
    found = [ct.message(_COHERE_ROLES.get(str(item.get("role")).upper(), str(item.get("role")).lower()),
                        [ct.text(item.get("message"))])
             for item in ct.listed(body.get("chat_history")) if isinstance(item, Mapping)]
    found += [ct.message(field(message, "role"), _parts(field(message, "content")))
              for message in body.get("messages") or () if isinstance(message, Mapping)]
    for key in ("prompt", "inputText", "message"):
        if isinstance(body.get(key), str):
            found.append(ct.message(sc.ROLE_USER, [ct.text(body[key])]))
    texts = body.get("texts")
    if isinstance(texts, list):
        found += [ct.message(sc.ROLE_USER, [ct.text(text)]) for text in texts if isinstance(text, str)]
    return found


def _request_body(kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """invoke_model's JSON body, given as bytes, text or a file object; empty when it is not a JSON object."""
    body = kwargs.get("body")
    if not isinstance(body, (bytes, bytearray, str)):
        body = _file_content(body)
        if body is None:
            return {}
    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _file_content(body: object) -> bytes | str | None:
    """What a seekable file object holds from where it stands, read and put back: botocore sends it from there, and
    reads and rewinds it the same way to sign it and to retry. None for anything else (botocore refuses a file that
    cannot seek)."""
    seekable = getattr(body, "seekable", None)
    if not (callable(seekable) and seekable()):
        return None
    file: Any = body
    start = file.tell()
    try:
        content = file.read()
    finally:
        file.seek(start)
    return content if isinstance(content, (bytes, str)) else None


def _server(client: Any) -> tuple[str | None, int | None]:
    return _address(client.meta.endpoint_url)


@functools.lru_cache(maxsize=64)
def _address(endpoint_url: str) -> tuple[str | None, int | None]:
    """A client's endpoint's host and port: the same few endpoints, parsed once each."""
    url = urlsplit(endpoint_url)
    return url.hostname, url.port or {"https": 443, "http": 80}.get(url.scheme)


def _sdk_call(client: Any, method: str) -> dict[str, Any]:
    """What the AWS SDK conventions put on an SDK call's span, as OpenTelemetry's botocore instrumentation does: our
    span is that call's. The region is the client's, also where its endpoint is a private one that does not name it."""
    attributes: dict[str, Any] = {sc.RPC_SYSTEM: sc.RPC_SYSTEM_AWS_API,
                                  sc.RPC_SERVICE: str(client.meta.service_model.service_id), sc.RPC_METHOD: method}
    region = client.meta.region_name
    if isinstance(region, str) and region:
        attributes[sc.CLOUD_REGION] = region
    return attributes


# --- response side: values every format shares -------------------------------------------------------------------


def _note_usage(op: Operation, input_tokens: object, output_tokens: object, cache_read: object = None,
                cache_write: object = None) -> None:
    """Record the counts given (None: not in this message). Bedrock leaves cached input out of its input count;
    the conventions count it in, and report it on its own too: whichever of them comes first (the model's JSON,
    or Bedrock's metrics at the stream's end)."""
    uncached = count(input_tokens)
    if uncached is None and op.input_tokens is not None:  # noted before: without the cache it counted then
        uncached = op.input_tokens - (op.cache_read_tokens or 0) - (op.cache_creation_tokens or 0)
    read, write = count(cache_read), count(cache_write)
    if read is not None:
        op.cache_read_tokens = read
    if write is not None:
        op.cache_creation_tokens = write
    if uncached is not None:
        op.input_tokens = uncached + (op.cache_read_tokens or 0) + (op.cache_creation_tokens or 0)
    tokens = count(output_tokens)
    if tokens is not None:
        op.output_tokens = tokens


def _note_finish(op: Operation, reason: object) -> None:
    if isinstance(reason, str) and reason:
        op.finish_reasons.append(reason)


def _note_text(op: Operation, text: object) -> int:
    """CONTENT when ``text`` is output text."""
    return CONTENT if isinstance(text, str) and text else OTHER


def _note_milliseconds(op: Operation, attribute: str, value: object) -> None:
    milliseconds = number(value)
    if milliseconds is not None:
        op.attributes[attribute] = milliseconds / 1000


def _read_headers(op: Operation, response: Mapping[str, Any]) -> None:
    """invoke_model's counts and latency headers (botocore spells header names in lower case)."""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    counts = []
    for name in _TOKEN_HEADERS:
        value = headers.get(name)
        counts.append(int(value) if isinstance(value, str) and value.isdigit() else None)
    _note_usage(op, *counts)
    latency = headers.get(_LATENCY_HEADER)
    if isinstance(latency, str) and latency.isdigit():
        _note_milliseconds(op, sc.PROVIDER_LATENCY, int(latency))


def _read_invocation_metrics(op: Operation, metrics: Mapping[str, Any]) -> None:
    """What Bedrock adds to a stream's last chunk: counts fill in what the model's own JSON did not say."""
    _note_usage(op, metrics.get("inputTokenCount") if op.input_tokens is None else None,
                metrics.get("outputTokenCount") if op.output_tokens is None else None,
                metrics.get("cacheReadInputTokenCount") if op.cache_read_tokens is None else None,
                metrics.get("cacheWriteInputTokenCount") if op.cache_creation_tokens is None else None)
    _note_milliseconds(op, sc.PROVIDER_LATENCY, metrics.get("invocationLatency"))
    _note_milliseconds(op, sc.PROVIDER_TIME_TO_FIRST_BYTE, metrics.get("firstByteLatency"))


def _name_error(op: Operation, error: ClientError) -> None:
    """error.type is the service's error code: a mid-stream exception event (EventStreamError) or an unmodeled
    code (ClientError) arrives under a class name that says nothing. Stream members are spelled
    ``throttlingException``; the code is ``ThrottlingException`` everywhere else."""
    code = error.response.get("Error", {}).get("Code")
    if isinstance(code, str) and code:
        op.error_type = code[0].upper() + code[1:]


# --- converse, and Amazon Nova's invoke_model JSON (the same shapes) ---------------------------------------------


def _read_converse(op: Operation, result: Mapping[str, Any]) -> None:
    _note_finish(op, result.get("stopReason"))
    _read_converse_usage(op, result.get("usage"))
    metrics = result.get("metrics")
    if isinstance(metrics, Mapping):
        _note_milliseconds(op, sc.PROVIDER_LATENCY, metrics.get("latencyMs"))


def _read_converse_usage(op: Operation, usage: object) -> None:
    if isinstance(usage, Mapping):
        # converse says cacheReadInputTokens, Nova's own JSON cacheReadInputTokenCount
        _note_usage(op, usage.get("inputTokens"), usage.get("outputTokens"),
                    usage.get("cacheReadInputTokens", usage.get("cacheReadInputTokenCount")),
                    usage.get("cacheWriteInputTokens", usage.get("cacheWriteInputTokenCount")))


def _observe_converse_event(op: Operation, event: Mapping[str, Any]) -> int:
    block = event.get("contentBlockDelta")
    if block is not None:
        delta = block.get("delta", {})
        if _note_text(op, delta.get("text")) == CONTENT:
            return CONTENT
        reasoning = delta.get("reasoningContent")
        if reasoning:
            if reasoning.get("text"):
                op.reasoning_streamed = True
                return CONTENT
            if reasoning.get("redactedContent") or not op.reasoning_streamed:  # redacted, or omitted (a signature)
                op.reasoning_hidden = True
            return OTHER  # neither a signature nor a redacted block is output anyone reads, as in Claude's events
        tool = delta.get("toolUse") or {}
        return CONTENT if tool.get("input") else OTHER
    if "messageStop" in event:  # the output is complete: the usage in metadata follows
        _note_finish(op, event["messageStop"].get("stopReason"))
        return DONE
    if "metadata" in event:
        _read_converse(op, event["metadata"])
        return DONE
    return OTHER


# --- invoke_model JSON of each model family: a whole body or one stream chunk ------------------------------------


def _read_claude(op: Operation, payload: Mapping[str, Any]) -> int:
    """Anthropic messages: the body (``message``) or one stream event."""
    kind = payload["type"]
    if kind == "content_block_delta":
        delta = payload.get("delta", {})
        if _note_text(op, delta.get("text")) == CONTENT:
            return CONTENT
        if delta.get("thinking"):
            op.reasoning_streamed = True  # the thinking tokens are among those streamed
            return CONTENT
        if delta.get("type") == "signature_delta":
            _claude.signature_arrived(op)
        return CONTENT if delta.get("partial_json") else OTHER  # a signature alone is no output
    if kind == "content_block_start":
        _claude.block_started(op, payload.get("content_block", {}).get("type"))
    elif kind == "message_start":
        _read_claude_message(op, payload.get("message", {}), final=False)
    elif kind == "message_delta":
        _note_finish(op, payload.get("delta", {}).get("stop_reason"))
        _read_claude_usage(op, payload.get("usage"))
    elif kind == "message":
        _read_claude_message(op, payload, final=True)
        _note_finish(op, payload.get("stop_reason"))
    return OTHER


def _read_claude_message(op: Operation, message: Mapping[str, Any], *, final: bool) -> None:
    if isinstance(message.get("id"), str):
        op.response_id = message["id"]
    if isinstance(message.get("model"), str):
        op.response_model = message["model"]
    _read_claude_usage(op, message.get("usage"), final=final)


def _read_claude_usage(op: Operation, usage: object, *, final: bool = True) -> None:
    """A stream's message_start has only a placeholder for output (1): output is read from final usage only, with
    the thinking tokens in it (which the stream may not have shown: thinking omitted or redacted)."""
    if isinstance(usage, Mapping):
        _note_usage(op, usage.get("input_tokens"), usage.get("output_tokens") if final else None,
                    usage.get("cache_read_input_tokens"), usage.get("cache_creation_input_tokens"))
        details = usage.get("output_tokens_details")
        thinking = count(details.get("thinking_tokens")) if final and isinstance(details, Mapping) else None
        if thinking is not None:
            op.reasoning_tokens = thinking


def _read_claude_text(op: Operation, payload: Mapping[str, Any]) -> int:
    """Anthropic's older text completions."""
    _note_finish(op, payload.get("stop_reason"))
    return _note_text(op, payload["completion"])


def _read_llama(op: Operation, payload: Mapping[str, Any]) -> int:
    _note_finish(op, payload.get("stop_reason"))
    _note_usage(op, payload.get("prompt_token_count"), payload.get("generation_token_count"))
    return _note_text(op, payload["generation"])


def _read_titan(op: Operation, payload: Mapping[str, Any]) -> int:
    results = payload.get("results")
    if isinstance(results, list):  # the whole body (or a rerank model's, whose results carry no counts)
        counts = [found for result in results if (found := count(field(result, "tokenCount"))) is not None]
        _note_usage(op, payload.get("inputTextTokenCount"), sum(counts) if counts else None)
        for result in results:
            _note_finish(op, field(result, "completionReason"))
        return OTHER
    _note_finish(op, payload.get("completionReason"))
    _note_usage(op, payload.get("inputTextTokenCount"), payload.get("totalOutputTextTokenCount"))
    return _note_text(op, payload.get("outputText"))


def _read_cohere(op: Operation, payload: Mapping[str, Any]) -> int:
    """Cohere generate (a body with ``generations``, chunks with ``text``) and chat (``event_type`` chunks)."""
    for generation in payload.get("generations", ()):
        _note_finish(op, generation.get("finish_reason"))
    response_id = payload.get("response_id", payload.get("id"))
    if isinstance(response_id, str):
        op.response_id = response_id
    _note_finish(op, payload.get("finish_reason"))
    event = payload.get("event_type", "text-generation")
    if event == "text-generation":
        return _note_text(op, payload.get("text"))
    if event == "tool-calls-chunk":  # chat's tool calls as they are written
        return CONTENT if payload.get("tool_call_delta") else OTHER
    if event == "tool-calls-generation" and not op.first_content_ns:  # written whole, with no chunks before
        return CONTENT if payload.get("tool_calls") else OTHER
    return OTHER


def _read_mistral(op: Operation, payload: Mapping[str, Any]) -> int:
    """Mistral completions (``outputs``) and chat (``choices``), bodies and chunks alike."""
    kind = OTHER
    for choice in payload.get("outputs") or payload.get("choices") or ():
        _note_finish(op, choice.get("stop_reason") or choice.get("finish_reason"))
        message = choice.get("message") or choice.get("delta")
        text = message.get("content") if isinstance(message, Mapping) else choice.get("text")
        if _note_text(op, text) == CONTENT or (isinstance(message, Mapping) and message.get("tool_calls")):
            kind = CONTENT
    return kind


def _read_payload(op: Operation, payload: object) -> int:
    """One model's invoke_model JSON, whole or a stream chunk, told apart by its keys."""
    if not isinstance(payload, dict):
        return OTHER
    if "completion" in payload:
        kind = _read_claude_text(op, payload)
    elif "type" in payload:
        kind = _read_claude(op, payload)
    elif "generation" in payload:
        kind = _read_llama(op, payload)
    elif "outputText" in payload or "results" in payload:
        kind = _read_titan(op, payload)
    elif "outputs" in payload or "choices" in payload:
        kind = _read_mistral(op, payload)
    elif "is_finished" in payload or "generations" in payload or "response_id" in payload:
        kind = _read_cohere(op, payload)
    elif "output" in payload:
        _read_converse(op, payload)
        kind = OTHER
    else:
        kind = _observe_converse_event(op, payload)  # Nova streams converse's events
    metrics = payload.get(_INVOCATION_METRICS)
    if isinstance(metrics, Mapping):  # Bedrock adds them to a stream's last chunk
        _read_invocation_metrics(op, metrics)
        kind |= DONE
    return kind


# --- content, when capture is on ----------------------------------------------------------------------------------


def _gather_converse_message(output: Output, message: object) -> None:
    found = output.choice()
    for key, block in enumerate(field(message, "content") or ()):
        if isinstance(block.get("text"), str):
            found.text(block["text"], key)
        elif "citationsContent" in block:  # an answer that cites the documents it was given: its text in parts
            for part in field(block["citationsContent"], "content") or ():
                if isinstance(text := field(part, "text"), str):
                    found.text(text, key)
        elif "reasoningContent" in block:
            reasoning = field(field(block["reasoningContent"], "reasoningText"), "text")
            if isinstance(reasoning, str):
                found.text(reasoning, key, sc.PART_REASONING)
        elif "toolUse" in block:
            tool = block["toolUse"]
            found.tool_call(key, tool.get("toolUseId"), tool.get("name"), whole=ct.plain(tool.get("input")))


def _gather_converse_event(output: Output, event: Mapping[str, Any]) -> None:
    """A tool call begins with its id and name; text and its input's JSON come in deltas, by block."""
    block = event.get("contentBlockDelta")
    if block is not None:
        delta, key = block.get("delta", {}), block.get("contentBlockIndex")
        if "text" in delta:
            output.choice().text(delta["text"], key)
        elif isinstance(field(delta.get("reasoningContent"), "text"), str):
            output.choice().text(delta["reasoningContent"]["text"], key, sc.PART_REASONING)
        elif "toolUse" in delta:
            output.choice().tool_call(key, fragment=delta["toolUse"].get("input"))
        return
    start = event.get("contentBlockStart")
    if start is not None and "toolUse" in start.get("start", {}):
        tool = start["start"]["toolUse"]
        output.choice().tool_call(start.get("contentBlockIndex"), tool.get("toolUseId"), tool.get("name"))


def _gather_payload(output: Output, payload: object) -> None:
    """One invoke_model JSON, whole or a stream chunk: Claude's messages and Nova's converse shapes in full, the
    other families' text."""
    if not isinstance(payload, dict):
        return
    if "type" in payload and "completion" not in payload:  # Claude's text completions say their type too
        if payload["type"] == "message":
            _claude.read_content(output, payload.get("content"))
        else:
            _claude.gather_event(output, payload)
    elif "output" in payload:
        _gather_converse_message(output, field(payload["output"], "message"))
    elif "contentBlockDelta" in payload or "contentBlockStart" in payload:
        _gather_converse_event(output, payload)
    else:
        for index, text, reason in _texts(payload):
            choice = output.choice(index)
            if text is not None:
                choice.text(text)
            choice.finish(reason)


def _texts(payload: Mapping[str, Any]) -> list[tuple[int, str | None, str | None]]:
    """The output text of a body or chunk of Claude's text completions, Llama, Titan, Cohere or Mistral, by choice,
    and why it stopped when it says (Cohere's finish_reason, Titan's completionReason, Mistral's stop_reason): a
    body's results, generations, outputs or choices are one each (a chunk's carry their index)."""
    found: list[tuple[int, str | None, str | None]] = [(0, _words(payload.get(key)), None)
                                                       for key in ("completion", "generation", "outputText")]
    if payload.get("event_type", "text-generation") == "text-generation":
        found.append((0, _words(payload.get("text")), None))
    items = payload.get("results") or payload.get("generations") or payload.get("outputs") or payload.get("choices")
    for position, item in enumerate(ct.listed(items)):
        if not isinstance(item, Mapping):
            continue
        message = item.get("message") or item.get("delta")
        text = message.get("content") if isinstance(message, Mapping) else item.get("text", item.get("outputText"))
        index = item.get("index")
        reason = item.get("finish_reason") or item.get("completionReason") or item.get("stop_reason")
        found.append((index if isinstance(index, int) else position, _words(text), _words(reason)))
    return [(index, text, reason) for index, text, reason in found if text or reason]


def _words(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


# --- endpoints ---------------------------------------------------------------------------------------------------


class _EventIterator(Transparent):
    """botocore's EventStream is iterable, not an iterator: this steps one iteration of it for the core's stream
    proxy (which wraps this, so the caller's object still is an EventStream). A mid-stream exception event is named
    by its code through ``read_error``, as a failed call is."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._self_events = iter(stream)

    def __next__(self) -> Any:
        return next(self._self_events)

    def __copy__(self) -> Any:
        return copy.copy(self.__wrapped__)  # a copy of the stream proxy steps through the proxy's own step


class _AsyncEventIterator(Transparent):
    """aiobotocore's AioEventStream, botocore's EventStream read with ``async for``: each ``__aiter__`` of it is a
    new async generator over its one source of events, and this steps the first for the core's async proxy."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._self_events = stream.__aiter__()

    def __anext__(self) -> Awaitable[Any]:
        return self._self_events.__anext__()  # type: ignore[no-any-return]

    def __copy__(self) -> Any:
        return copy.copy(self.__wrapped__)


class _Replay(io.BytesIO):
    """What the caller's StreamingBody reads once we have read the HTTP body within the call: the same bytes, as
    urllib3's response gives them (nothing after a close, and always readable). botocore's set_socket_timeout reaches
    through it to the socket; the body is in memory, so a timeout has nothing left to bound."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self._fp = _NoSocket()

    def read(self, size: int | None = -1) -> bytes:
        return b"" if self.closed else super().read(size)

    def readable(self) -> bool:
        return True


class _NoSocket:
    """The path botocore's StreamingBody.set_socket_timeout takes to urllib3's socket (``_fp.fp.raw._sock``)."""

    def __init__(self) -> None:
        self.fp = self.raw = self._sock = self

    def settimeout(self, timeout: float | None) -> None:
        pass


class _Unreadable(io.RawIOBase):
    """A body whose read within the call failed: the caller meets the same error where it would have, at read(). The
    bytes that came before the failure are not handed over (urllib3 keeps those it read for a read it cannot finish,
    so only a caller reading in small pieces would have had some of them)."""

    def __init__(self, error: Exception) -> None:
        self._error = error
        self._fp = _NoSocket()

    def read(self, size: int = -1) -> bytes:
        raise self._error

    def readable(self) -> bool:
        return True


class _AsyncReplay:
    """_Replay for the httpx response of aiobotocore's httpx backend, once we have read its body within the call:
    ``aread()`` gives the bytes, ``aiter_raw()`` what it has not given yet, and nothing after a close, as httpx's
    closed response gives. What else a caller asks of it (its status, its headers) is the real response's."""

    def __init__(self, raw: object) -> None:
        self._raw = raw
        self.url = getattr(raw, "url", None)
        self._data = self._left = b""
        self._closed = False

    def hold(self, data: bytes) -> None:
        self._data = self._left = data

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        rest, self._left = self._left, b""
        if rest and not self._closed:
            yield rest

    async def aread(self) -> bytes:
        return self._data

    def close(self) -> None:
        self._closed = True

    async def aclose(self) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        raw = self.__dict__.get("_raw")  # not there in a copy being made: no lookup of it through here again
        if raw is None:
            raise AttributeError(name)
        return getattr(raw, name)


def _replaying(response: Any) -> tuple[Any, Callable[[bytes], None]]:
    """What the body we hand over reads, and what gives it the bytes we read of ``response``.

    aiohttp's response is the caller's own: a content stream of aiohttp's holding those bytes takes the place of the
    one we read, so that what a caller does with the response (``read()``, ``text()``, ``json()``, its content's
    reads, ``async with``, a read after its release failing) is aiohttp's own doing. httpx's gets a stand-in."""
    aiohttp, protocols = sys.modules.get("aiohttp"), sys.modules.get("aiohttp.base_protocol")
    if aiohttp is None or protocols is None or not isinstance(response, aiohttp.ClientResponse):
        stand_in = _AsyncReplay(response)
        return stand_in, stand_in.hold
    loop = asyncio.get_running_loop()
    # a protocol of no connection: the stream holds all the bytes at once, and pausing it reads nothing
    content = aiohttp.StreamReader(protocols.BaseProtocol(loop), 2**16, loop=loop)

    def hold(data: bytes) -> None:
        content.feed_data(data)
        content.feed_eof()
        response.content = content

    return response, hold


def _aio_bodies() -> tuple[type, ...]:
    """aiobotocore's response bodies of its two backends (aiohttp, httpx), whose response _AsyncReplay stands in
    for (these names are 3.x's aliases of its own); any other body is left unread."""
    module = sys.modules.get("aiobotocore.response")
    kinds = (getattr(module, name, None) for name in ("StreamingBody", "HttpxStreamingBody"))
    return tuple(kind for kind in kinds if isinstance(kind, type))


def _content_length(body: Any) -> Any:
    """The length a body checks what it reads against, as the response's header gave it (None without one): the body
    we hand over checks as the one we read did. 2.x's body, a proxy, keeps it under the proxy's prefix."""
    return getattr(body, "_self_content_length" if isinstance(body, wrapt.ObjectProxy) else "_content_length", None)


def _aio_response(body: Any) -> Any:
    """The response an aiobotocore body reads: 3.x's holds it, 2.x's is a proxy of it."""
    return body.__wrapped__ if isinstance(body, wrapt.ObjectProxy) else body.raw_stream


class _Endpoint:
    """One bedrock-runtime operation. ``receive`` runs inside the measured call, on botocore's result, and does
    I/O only: what it returns is what the core adopts; ``deliver`` builds the caller's result around that."""

    method: str  # the API's name for it
    stream = False

    def describe(self, instance: Any, kwargs: dict[str, Any], settings: Settings) -> Request:
        model = kwargs.get("modelId")
        model = model if isinstance(model, str) else None
        body = self.request_body(kwargs)
        prompt = [body[key] for key in _PROMPT_KEYS if isinstance(body.get(key), (str, list))]
        host, port = _server(instance)
        request = Request(
            operation=self.operation(model, body),
            provider=sc.PROVIDER_AWS_BEDROCK,
            model=model,
            server_address=host,
            server_port=port,
            stream=self.stream,
            prompt_chars=prompt_chars(_text_chars, prompt) if prompt else None,
            attributes={**_request_parameters(body), **_sdk_call(instance, self.method)},
        )
        guardrail = self.guardrail(kwargs)
        if isinstance(guardrail, str) and guardrail:
            request.attributes[sc.AWS_BEDROCK_GUARDRAIL_ID] = guardrail
        if settings.capture_content.enabled:
            request.system_instructions = ct.safely(lambda: _parts(body.get("system", body.get("preamble"))) or None)
            request.input_messages = ct.safely(lambda: _input_messages(body))
        return request

    def request_body(self, kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
        return kwargs

    def operation(self, model: str | None, body: Mapping[str, Any]) -> str:
        return sc.OP_CHAT

    def guardrail(self, kwargs: Mapping[str, Any]) -> object:
        """The guardrail applied to the call, as the caller named it (an id or an ARN)."""
        return field(kwargs.get("guardrailConfig"), "guardrailIdentifier")

    def prepare(self, op: Operation, kwargs: dict[str, Any], settings: Settings) -> dict[str, Any]:
        if settings.capture_content.enabled and self.answers(kwargs):
            op.output = Output()
        return kwargs

    def answers(self, kwargs: Mapping[str, Any]) -> bool:
        return True

    def receive(self, response: dict[str, Any]) -> Any:
        return response

    async def receive_async(self, response: dict[str, Any]) -> Any:
        """``receive`` for aiobotocore's result."""
        return self.receive(response)

    def deliver(self, response: dict[str, Any], adopted: Any) -> Any:
        return adopted

    def kind(self, op: Operation, result: Any) -> Kind:
        if isinstance(result, _EventIterator):
            return Kind.STREAM
        return Kind.ASYNC_STREAM if isinstance(result, _AsyncEventIterator) else Kind.COMPLETE

    def read(self, op: Operation, result: Any) -> None:
        raise NotImplementedError

    def refused(self, op: Operation, error: Exception, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        return None  # prepare() adds nothing to the request

    def read_error(self, op: Operation, error: BaseException) -> None:
        if isinstance(error, ClientError):
            _name_error(op, error)
            # a signature mismatch quotes the canonical request it computed, the session token among its headers
            op.secrets = bearer_secrets(_SESSION_TOKEN.findall(str(error)))

    def observe(self, op: Operation, chunk: Any) -> int:
        raise NotImplementedError

    def gather(self, op: Operation, chunk: Any) -> None:
        raise NotImplementedError


class _Converse(_Endpoint):
    method = "Converse"

    def read(self, op: Operation, result: Any) -> None:
        _read_converse(op, result)
        if op.output is not None:
            _gather_converse_message(op.output, field(result.get("output"), "message"))


class _StreamEndpoint(_Endpoint):
    stream = True
    key = "stream"  # where botocore's result holds the EventStream

    def receive(self, response: dict[str, Any]) -> Any:
        events = response.get(self.key)
        # botocore's EventStream, or aiobotocore's (async); anything else (a Stubber's stand-in, nothing) is the
        # caller's as it is
        if not isinstance(events, EventStream):
            return response
        return _AsyncEventIterator(events) if hasattr(type(events), "__aiter__") else _EventIterator(events)

    def deliver(self, response: dict[str, Any], adopted: Any) -> Any:
        return response if adopted is response else {**response, self.key: adopted}

    def read(self, op: Operation, result: Any) -> None:
        pass  # no EventStream to read (see receive)


class _ConverseStream(_StreamEndpoint):
    method = "ConverseStream"

    def observe(self, op: Operation, chunk: Any) -> int:
        return _observe_converse_event(op, chunk)

    def gather(self, op: Operation, chunk: Any) -> None:
        assert op.output is not None  # gather runs only when capture is on
        _gather_converse_event(op.output, chunk)


# request fields only embedding models take: Cohere Embed's texts and input type, Titan Embeddings' options
_EMBEDDING_FIELDS = frozenset(("texts", "input_type", "dimensions", "normalize", "embeddingTypes", "embeddingConfig",
                               "inputImage"))


class _Invoke(_Endpoint):
    def request_body(self, kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
        return _request_body(kwargs)

    def guardrail(self, kwargs: Mapping[str, Any]) -> object:
        return kwargs.get("guardrailIdentifier")

    def operation(self, model: str | None, body: Mapping[str, Any]) -> str:
        if "messages" in body or "message" in body:
            return sc.OP_CHAT
        # an embedding model by its name, or by its request's own fields where an ARN names no model
        if "embed" in (model or "").rpartition("/")[2] or not _EMBEDDING_FIELDS.isdisjoint(body):
            return sc.OP_EMBEDDINGS
        return sc.OP_TEXT_COMPLETION

    def answers(self, kwargs: Mapping[str, Any]) -> bool:
        return self.operation(kwargs.get("modelId"), self.request_body(kwargs)) != sc.OP_EMBEDDINGS


class _InvokeModel(_Invoke):
    method = "InvokeModel"

    def receive(self, response: dict[str, Any]) -> Any:
        """The body is the answer: read within the call, and an equal one handed over. One that fails to read is
        handed over failing the same way, so the caller meets the error at read(), as it would have; the operation
        records it. A body that is not botocore's (a Stubber's bytes) is left as it is, unread."""
        body = response.get("body")
        if not isinstance(body, StreamingBody):
            return response, None, None
        try:
            data = body.read()
        except Exception as error:  # ResponseStreamingError, ReadTimeoutError, IncompleteReadError: the caller's
            reraise_if_signalled()
            response["body"] = StreamingBody(_Unreadable(error), None)
            return response, None, error
        response["body"] = StreamingBody(_Replay(data), _content_length(body))
        return response, data, None

    async def receive_async(self, response: dict[str, Any]) -> Any:
        """``receive`` of aiobotocore's body, read with ``await``. One that fails to read stays the caller's: its
        transport has failed, and a read of it fails again as it does."""
        body: Any = response.get("body")
        if type(body) not in _aio_bodies():
            return response, None, None
        try:  # made before the read: a body of a release whose class we cannot make so is left unread
            raw, hold = _replaying(_aio_response(body))
            replay = type(body)(raw, _content_length(body))
        except Exception:
            report_failure("aiobotocore body")
            return response, None, None
        try:
            data = await body.read()
        except Exception as error:  # aiohttp's ClientPayloadError, AioReadTimeoutError, ...: the caller's
            reraise_if_signalled()
            return response, None, error
        hold(data)
        response["body"] = replay
        return response, data, None

    def deliver(self, response: dict[str, Any], adopted: Any) -> Any:
        return response

    def read(self, op: Operation, result: Any) -> None:
        response, data, error = result
        _read_headers(op, response)
        if error is not None:
            op.error_type = type(error).__name__
        elif "json" in response.get("contentType", "") and data:
            payload = json.loads(data)
            _read_payload(op, payload)
            if op.output is not None:
                _gather_payload(op.output, payload)


class _InvokeModelStream(_Invoke, _StreamEndpoint):
    method = "InvokeModelWithResponseStream"
    key = "body"

    def observe(self, op: Operation, chunk: Any) -> int:
        part = chunk.get("chunk")
        return OTHER if part is None else _read_payload(op, json.loads(part["bytes"]))

    def gather(self, op: Operation, chunk: Any) -> None:
        """The chunk's JSON once more: only when capture is on, so a stream without it parses each chunk once."""
        assert op.output is not None  # gather runs only when capture is on
        part = chunk.get("chunk")
        if part is not None:
            _gather_payload(op.output, json.loads(part["bytes"]))


_ENDPOINTS: Mapping[str, _Endpoint] = {
    endpoint.method: endpoint for endpoint in (_Converse(), _ConverseStream(), _InvokeModel(), _InvokeModelStream())
}


def _api_call_arguments(operation_name: str, api_params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return operation_name, api_params


# the wrappers of BaseClient._make_api_call (botocore's) and AioBaseClient._make_api_call (aiobotocore's) that each
# instrumentation round made, by its telemetry
_API_CALL_WRAPPERS: weakref.WeakKeyDictionary[Telemetry, Wrapper] = weakref.WeakKeyDictionary()
_AIO_API_CALL_WRAPPERS: weakref.WeakKeyDictionary[Telemetry, Wrapper] = weakref.WeakKeyDictionary()


def _dispatch(calls: Mapping[str, tuple[_Endpoint, Wrapper]], instance: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> tuple[str, dict[str, Any], _Endpoint, Wrapper] | None:
    """The operation's name, its ``api_params``, endpoint and call wrapper, if it is one we record."""
    try:
        operation_name, params = _api_call_arguments(*args, **kwargs)
        if instance.meta.service_model.service_name != _SERVICE or operation_name not in calls:
            return None
        return operation_name, params, *calls[operation_name]
    except Exception:
        report_failure("bedrock dispatch")
        return None


class _Received:
    """What the client's own call returned inside the core's, for the endpoint to build the caller's result from."""

    __slots__ = ("_endpoint", "_outer", "measured", "response")

    def __init__(self, endpoint: _Endpoint) -> None:
        self._endpoint = endpoint
        self._outer = current_operation()
        self.response: dict[str, Any] = {}
        self.measured = False

    def took(self, result: dict[str, Any]) -> bool:
        """Whether the core measures this call. It may call as if we were not there (suppressed, say, or this is a
        wrapper of an earlier round under the round recording the call): then so do we."""
        if current_operation() is self._outer:
            return False
        self.measured = True
        self.response.update(result)
        return True

    def deliver(self, outcome: Any) -> Any:
        return self._endpoint.deliver(self.response, outcome) if self.measured else outcome


def _api_call(telemetry: Telemetry) -> Wrapper:
    """``BaseClient._make_api_call(operation_name, api_params)`` serves every AWS service: bedrock-runtime's inference
    operations go through the core as endpoints called with ``api_params``; everything else passes untouched."""
    calls = {name: (endpoint, sync_call(endpoint)(telemetry)) for name, endpoint in _ENDPOINTS.items()}

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        found = _dispatch(calls, instance, args, kwargs)
        if found is None:
            return wrapped(*args, **kwargs)
        operation_name, params, endpoint, call = found
        received = _Received(endpoint)

        def send(**api_params: Any) -> Any:
            result = wrapped(operation_name, api_params)
            return endpoint.receive(received.response) if received.took(result) else result

        return received.deliver(call(send, instance, (), params))

    _API_CALL_WRAPPERS[telemetry] = wrapper
    return wrapper


def _aio_api_call(telemetry: Telemetry) -> Wrapper:
    """aiobotocore's ``AioBaseClient._make_api_call``, a coroutine function that serves every AWS service as
    botocore's does: the same operations go through the core's async call, everything else passes untouched."""
    calls = {name: (endpoint, async_call(endpoint)(telemetry)) for name, endpoint in _ENDPOINTS.items()}

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        found = _dispatch(calls, instance, args, kwargs)
        if found is None:
            return wrapped(*args, **kwargs)
        operation_name, params, endpoint, call = found
        received = _Received(endpoint)

        async def send(**api_params: Any) -> Any:
            result = await wrapped(operation_name, api_params)
            return await endpoint.receive_async(received.response) if received.took(result) else result

        async def run() -> Any:
            return received.deliver(await call(send, instance, (), params))

        return named_after(wrapped, run())

    _AIO_API_CALL_WRAPPERS[telemetry] = wrapper
    return wrapper


def _leave_inference_to_us(telemetry: Telemetry) -> Wrapper:
    """OpenTelemetry's botocore instrumentation records bedrock-runtime's inference calls as GenAI spans and metrics
    too (its bedrock extension, under the same metric names, with buckets of its own): beside it every call would be
    recorded twice. Its extension is asked, before it opens a span, whether to trace the call; for the operations
    we record the answer is no while our wrapper is on the client's path, whichever of the two wrapped it first.
    Every other AWS call, bedrock-runtime's others included, it traces as before. Asked from a coroutine, the call is
    aiobotocore's (its 0.66 has no bedrock extension for aiobotocore, so it does not ask yet), and the path is
    aiobotocore's."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            if not telemetry.retired and instance._call_context.operation in _ENDPOINTS \
                    and _on_the_clients_path(telemetry, _asked_from_coroutine(sys._getframe(1))):
                return False
        except Exception:
            report_failure("botocore instrumentation")
        return wrapped(*args, **kwargs)

    return wrapper


def _on_the_clients_path(telemetry: Telemetry, aio: bool) -> bool:
    """Whether this round's wrapper is still on botocore's path (aiobotocore's): another library's uninstrument()
    may have taken it off (OpenTelemetry's removes whichever wrapper is outermost), and then the call is theirs to
    record."""
    mine = (_AIO_API_CALL_WRAPPERS if aio else _API_CALL_WRAPPERS).get(telemetry)
    client = getattr(sys.modules.get("aiobotocore.client"), "AioBaseClient", None) if aio else BaseClient
    method = vars(client).get("_make_api_call") if isinstance(client, type) else None
    while isinstance(method, wrapt.FunctionWrapper):
        if method._self_wrapper is mine:
            return True
        method = method.__wrapped__
    return False


def _asked_from_coroutine(frame: FrameType | None) -> bool:
    """Whether the code calling a wrapped method (past wrapt's own frames, which its C extension does not add) is
    a coroutine."""
    while frame is not None and str(frame.f_globals.get("__name__")).split(".")[0] == "wrapt":
        frame = frame.f_back
    return frame is not None and bool(frame.f_code.co_flags & inspect.CO_COROUTINE)


def _response_arguments(http_response: Any, operation_model: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    return http_response, operation_model


def _response_arrived(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """An HTTP response for the operation is in (botocore converts each twice, before and after parsing; the last
    mark counts): for streams and invoke_model that is as the headers arrive, converse's small body comes with them.
    Its request id is what AWS support asks for; of a call retried, the last response's."""
    http_response, operation_model = _response_arguments(*args, **kwargs)
    if operation_model.service_model.service_name != _SERVICE:
        return
    op.headers_ns = op.last_activity_ns = _clock()
    for name in _REQUEST_ID_HEADERS:
        request_id = http_response.headers.get(name)
        if isinstance(request_id, str) and request_id:
            op.attributes[sc.AWS_REQUEST_ID] = request_id
            return


def _retry_arguments(attempts: int, operation_model: Any, *args: Any, **kwargs: Any) -> tuple[int, Any]:
    return attempts, operation_model


def _attempted(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """botocore asks whether to retry after every attempt, so the last ask knows how many there were."""
    attempts, operation_model = _retry_arguments(*args, **kwargs)
    if operation_model.service_model.service_name == _SERVICE:
        op.retries = attempts - 1


PROVIDER = Provider(
    name="bedrock",
    targets=(
        Target("botocore.client", "BaseClient._make_api_call", _api_call),
        # headers and retries: deeper in botocore, on behalf of the operation running in this context
        Target("botocore.endpoint", "convert_to_response_dict", hook(_response_arrived)),
        Target("botocore.endpoint", "Endpoint._needs_retry", hook(_attempted)),
        # present only where opentelemetry-instrumentation-botocore is installed
        Target("opentelemetry.instrumentation.botocore.extensions.bedrock",
               "_BedrockRuntimeExtension.should_trace_service_call", _leave_inference_to_us),
    ),
)

# aiobotocore's own of the first three, patched when aiobotocore is imported (providers/aiobotocore.py): a service
# that has it installed and uses boto3 alone does not import it, nor aiohttp
AIO_PROVIDER = Provider(
    name="aiobotocore",
    targets=(
        Target("aiobotocore.client", "AioBaseClient._make_api_call", _aio_api_call),
        Target("aiobotocore.endpoint", "convert_to_response_dict", hook(_response_arrived)),
        Target("aiobotocore.endpoint", "AioEndpoint._needs_retry", hook(_attempted)),
    ),
)
