"""The openai client: what its calls, responses, chunks and headers mean, as plain values. No spans, no meters.

Covers chat completions (``create``, ``parse``, the ``stream()`` helper), the Responses API (``create``, ``parse``,
``stream()``), legacy completions and embeddings, sync and async, including ``with_raw_response`` and
``with_streaming_response``. OpenAI-compatible servers and Azure OpenAI go through the same client classes.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import openai
import pydantic
from openai import APIResponse, AsyncAPIResponse, AsyncStream, Stream
from openai._constants import RAW_RESPONSE_HEADER
from openai._legacy_response import LegacyAPIResponse
from openai._streaming import SSEDecoder
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from otel_llm import _content as ct
from otel_llm import _semconv as sc
from otel_llm._calls import Kind, async_call, before, hook, selected, sync_call
from otel_llm._content import Choice, Message, Output, Part
from otel_llm._operation import Request
from otel_llm._patching import Provider, Target
from otel_llm._safety import report_failure, reraise_if_signalled
from otel_llm._stream import CONTENT, DONE, HIDDEN, OTHER, closed_by_helper
from otel_llm.providers._stainless import (
    ResponseHeaders,
    helper_target,
    not_given_markers,
    parsed_body,
    raw_stream_of,
    read_sent,
    request_secrets,
)
from otel_llm.providers._values import count, field, parameter, prompt_chars, streams, text_counter

if TYPE_CHECKING:
    from otel_llm._operation import Operation
    from otel_llm._settings import Settings

_KNOWN_HOSTS: Mapping[str, str] = {
    "api.groq.com": sc.PROVIDER_GROQ,
    "api.deepseek.com": sc.PROVIDER_DEEPSEEK,
    "api.x.ai": sc.PROVIDER_XAI,
    "api.mistral.ai": sc.PROVIDER_MISTRAL,
    "api.perplexity.ai": sc.PROVIDER_PERPLEXITY,
}

# Azure's hosts of OpenAI models, reached with the plain client through base_url (the v1 API): an Azure OpenAI
# resource, an AI Services one, and an AI Foundry one, whose /models path is Azure AI model inference instead
_AZURE_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")


def _azure_provider(host: str, path: str) -> str:
    if host.endswith(".services.ai.azure.com") and path.startswith("/models"):
        return sc.PROVIDER_AZURE_AI_INFERENCE
    return sc.PROVIDER_AZURE_OPENAI


_HEADERS = ResponseHeaders((
    (sc.RATE_LIMIT_REQUESTS, "x-ratelimit-remaining-requests", "x-ratelimit-limit-requests"),
    (sc.RATE_LIMIT_TOKENS, "x-ratelimit-remaining-tokens", "x-ratelimit-limit-tokens"),
))

# (address, port) of servers that refused stream_options: asked for usage no more
_NO_STREAM_OPTIONS: set[tuple[str | None, int | None]] = set()
_MAX_REMEMBERED_SERVERS = 1024

_REFUSED_ANSWER = (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError)

# Responses API stream events that carry output: the first of them is the first token
_RESPONSES_CONTENT_EVENTS = frozenset({
    "response.output_text.delta",
    "response.refusal.delta",
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.audio.delta",
    "response.audio.transcript.delta",
    "response.code_interpreter_call_code.delta",
    "response.mcp_call_arguments.delta",
    "response.shell_call_command.delta",
})
_RESPONSES_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# a tool the service runs itself (hosted tools) has finished: the model waited on it, decoding nothing
_RESPONSES_HOSTED_TOOL_DONE = frozenset({
    "response.web_search_call.completed",
    "response.file_search_call.completed",
    "response.code_interpreter_call.completed",
    "response.image_generation_call.completed",
    "response.mcp_call.completed",
    "response.mcp_call.failed",
    "response.shell_call_output_content.done",  # a shell in the service's container (a local one ends the response)
})


# --- request side ----------------------------------------------------------------------------------------------


def _provider_and_server(resource: Any) -> tuple[str, str | None, int | None]:
    client = getattr(resource, "_client", None)
    client_type = type(client)
    url = _base_url(client, client_type)
    cached = _servers.get(id(url))
    if cached is not None and cached[0] is url and cached[1] is client_type:
        return cached[2]
    host: str | None = getattr(url, "host", None) or None
    port: int | None = None
    if url is not None:
        port = url.port or (443 if url.scheme == "https" else 80)
    if "Azure" in client_type.__name__:
        provider = sc.PROVIDER_AZURE_OPENAI
    elif host is not None and host.endswith(_AZURE_HOSTS):
        provider = _azure_provider(host, str(getattr(url, "path", "")))
    elif "Bedrock" in client_type.__name__:
        provider = sc.PROVIDER_AWS_BEDROCK
    else:
        provider = _KNOWN_HOSTS.get(host or "", sc.PROVIDER_OPENAI)
    if len(_servers) >= 256:  # clients made per request: start over rather than grow
        _servers.clear()
    _servers[id(url)] = (url, client_type, (provider, host, port))
    return provider, host, port


def _base_url(client: Any, client_type: type) -> Any:
    """The client's base URL: the object it keeps, read straight where its class's base_url property is openai's
    own and only returns that (openai 3.x's imports a module at every read, ~1 us). Any other property (the
    module-level client's reads a global; one patched onto a class later) is asked every time."""
    prop = getattr(client_type, "base_url", None)
    if not isinstance(prop, property):
        return getattr(client, "base_url", None)
    plain = _PLAIN_BASE_URL.get(prop, False)
    if plain is None:  # seen once per property: it must hand back the very object kept
        plain = _PLAIN_BASE_URL[prop] = getattr(client, "base_url", None) is getattr(client, "_base_url", _MISSING)
    return client._base_url if plain else getattr(client, "base_url", None)


# openai's own base_url properties (of OpenAI, AsyncOpenAI, BaseClient) -> whether they only return _base_url (None:
# not seen yet)
_PLAIN_BASE_URL: dict[property, bool | None] = {
    prop: None for owner in (openai.OpenAI, openai.AsyncOpenAI, openai._base_client.BaseClient)
    if isinstance(prop := vars(owner).get("base_url"), property)}
_MISSING = object()


# id(base URL) -> (that URL, the client's type, what they tell): a client's URL object is read once, not per call
_servers: dict[int, tuple[Any, type, tuple[str, str | None, int | None]]] = {}


# a prompt's text: message content, content parts' text, and what earlier turns passed back: refusals, tool calls'
# arguments (chat messages' tool_calls and legacy function_call, Responses function_call items), custom tool calls'
# input (chat's custom calls, Responses custom_tool_call items) and tool outputs
_PROMPT_KEYS = ("content", "text", "refusal", "output", "arguments", "input", "tool_calls", "function", "custom",
                "function_call")
_text_chars = text_counter(*_PROMPT_KEYS)


def _part(part: Any) -> Part:
    """A content part of a chat message (``text``, ``image_url``, ``input_audio``, ``file``) or of a Responses input
    item (``input_text``, ``output_text``, ``input_image``, ``input_file``), as a part of the conventions."""
    kind = field(part, "type")
    if kind in ("text", "input_text", "output_text"):
        return ct.text(field(part, "text"))
    if kind == "refusal":
        return {**ct.other(kind), "content": field(part, "refusal")}
    if kind == "image_url":
        return ct.linked(sc.MODALITY_IMAGE, field(field(part, "image_url"), "url"))
    if kind == "input_image":
        file_id = field(part, "file_id")
        if isinstance(file_id, str):
            return ct.file(sc.MODALITY_IMAGE, file_id)
        return ct.linked(sc.MODALITY_IMAGE, field(part, "image_url"))
    if kind == "input_audio":
        audio_format = field(field(part, "input_audio"), "format")
        return ct.blob(sc.MODALITY_AUDIO, f"audio/{audio_format}" if isinstance(audio_format, str) else None)
    if kind in ("file", "input_file"):
        found = field(part, "file") if kind == "file" else part
        file_id, file_url, data = field(found, "file_id"), field(found, "file_url"), field(found, "file_data")
        if isinstance(file_id, str):
            return ct.file(sc.MODALITY_DOCUMENT, file_id)
        if isinstance(file_url, str):
            return ct.uri(sc.MODALITY_DOCUMENT, file_url)
        if isinstance(data, str):  # base64, or a data URL that names its type
            return ct.linked(sc.MODALITY_DOCUMENT, data) if data.startswith("data:") else ct.blob(sc.MODALITY_DOCUMENT)
    return ct.other(kind)


def _parts(content: Any) -> list[Part]:
    if isinstance(content, str):
        return [ct.text(content)]
    return [_part(part) for part in content] if isinstance(content, (list, tuple)) else []


def _tool_result(content: Any) -> object:
    """What a tool answered: its text, or its content parts."""
    return content if isinstance(content, str) else _parts(content)


def _chat_messages(messages: Any) -> list[Message]:
    """Chat messages: system and developer messages keep their role; assistant tool calls and tool results become
    tool_call and tool_call_response parts."""
    found = []
    for message in messages if isinstance(messages, (list, tuple)) else ():
        role = field(message, "role")
        content = field(message, "content")
        if role in ("tool", "function"):  # function: the legacy form, answered by name
            parts = [ct.tool_call_response(field(message, "tool_call_id"), _tool_result(content))]
        else:
            parts = _parts(content)
            for call in ct.listed(field(message, "tool_calls")):
                function = field(call, "function") or field(call, "custom")
                parts.append(ct.tool_call(field(call, "id"), field(function, "name"),
                                          ct.arguments(field(function, "arguments") or field(function, "input"))))
            legacy = field(message, "function_call")
            if legacy is not None:
                parts.append(ct.tool_call(None, field(legacy, "name"), ct.arguments(field(legacy, "arguments"))))
        found.append(ct.message(role, parts, field(message, "name")))
    return found


def _responses_input(value: Any) -> list[Message]:
    """The Responses API's input: a string is the user's message; items are messages, the model's tool calls and
    reasoning, and their outputs."""
    if isinstance(value, str):
        return [ct.message(sc.ROLE_USER, [ct.text(value)])]
    found = []
    for item in value if isinstance(value, (list, tuple)) else ():
        kind, role = field(item, "type"), field(item, "role")
        if role is not None:
            found.append(ct.message(role, _parts(field(item, "content"))))
        elif kind in ("function_call", "custom_tool_call"):  # a custom call's input is its arguments
            found.append(ct.message(sc.ROLE_ASSISTANT, [ct.tool_call(field(item, "call_id"), field(item, "name"),
                ct.arguments(field(item, "arguments" if kind == "function_call" else "input")))]))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            found.append(ct.message(sc.ROLE_TOOL, [ct.tool_call_response(
                field(item, "call_id"), _tool_result(field(item, "output")))]))
        elif kind == "reasoning":
            found.append(ct.message(sc.ROLE_ASSISTANT, [
                ct.reasoning(field(part, "text"))
                for part in (*ct.listed(field(item, "summary")), *ct.listed(field(item, "content")))]))
        else:  # built-in tools' calls (the model's) and their outputs
            is_output = isinstance(kind, str) and kind.endswith("_output")
            found.append(ct.message(sc.ROLE_TOOL if is_output else sc.ROLE_ASSISTANT, [ct.other(kind)]))
    return found


def _prompts(value: Any) -> list[Message]:
    """Legacy completions' prompt and embeddings' input: each string a user message; token arrays are not text."""
    if isinstance(value, str):
        value = [value]
    texts = value if isinstance(value, (list, tuple)) else ()
    return [ct.message(sc.ROLE_USER, [ct.text(item)]) for item in texts if isinstance(item, str)]


_NUMERIC_PARAMETERS: Mapping[str, str] = {
    "temperature": sc.REQUEST_TEMPERATURE,
    "top_p": sc.REQUEST_TOP_P,
    "frequency_penalty": sc.REQUEST_FREQUENCY_PENALTY,
    "presence_penalty": sc.REQUEST_PRESENCE_PENALTY,
    "seed": sc.REQUEST_SEED,
}
_MAX_TOKENS_PARAMETERS = ("max_completion_tokens", "max_tokens", "max_output_tokens")  # the first given wins
_PARAMETERS = frozenset((*_NUMERIC_PARAMETERS, *_MAX_TOKENS_PARAMETERS, "n", "stop"))


def _request_parameters(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    extra = kwargs.get("extra_body")
    if extra is not None and isinstance(extra, Mapping) and not _PARAMETERS.isdisjoint(extra):
        kwargs = {**kwargs, **extra}  # the client lays it over the typed arguments
    if _PARAMETERS.isdisjoint(kwargs):  # most calls pass none of them
        return attributes
    given = kwargs.keys() & _PARAMETERS  # look only at what was passed
    for key in given:
        name = _NUMERIC_PARAMETERS.get(key)
        if name is not None and (value := parameter(name, kwargs[key])) is not None:
            attributes[name] = value
    for key in _MAX_TOKENS_PARAMETERS:
        value = parameter(sc.REQUEST_MAX_TOKENS, kwargs.get(key))
        if value is not None:
            attributes[sc.REQUEST_MAX_TOKENS] = value
            break
    n = parameter(sc.REQUEST_CHOICE_COUNT, kwargs.get("n"))
    if n is not None and n != 1:
        attributes[sc.REQUEST_CHOICE_COUNT] = n
    stop = kwargs.get("stop")
    if isinstance(stop, str):
        attributes[sc.REQUEST_STOP_SEQUENCES] = [stop]
    elif isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        attributes[sc.REQUEST_STOP_SEQUENCES] = list(stop)
    return attributes


_OUTPUT_TYPES = {"json_schema": sc.OUTPUT_JSON, "json_object": sc.OUTPUT_JSON, "text": sc.OUTPUT_TEXT}

# Responses stream events whose delta is captured as it comes, as the part it adds to
_RESPONSES_GATHERED = {
    "response.output_text.delta": sc.PART_TEXT,
    "response.refusal.delta": sc.PART_REFUSAL,
    "response.reasoning_summary_text.delta": sc.PART_REASONING,
    "response.reasoning_text.delta": sc.PART_REASONING,
    "response.function_call_arguments.delta": sc.PART_TOOL_CALL,
    "response.custom_tool_call_input.delta": sc.PART_TOOL_CALL,
}
# output items whose content streams as deltas of their own (the others are named at their start)
_RESPONSES_STREAMED_ITEMS = frozenset({"message", "reasoning"})


def _output_type(kwargs: Mapping[str, Any]) -> str | None:
    """The output format a request names: chat's response_format, the Responses API's text.format, or the class
    that .parse() is given (structured output: json)."""
    given = kwargs.get("response_format")
    if given is None:
        text = kwargs.get("text")
        given = text.get("format") if isinstance(text, Mapping) else None
    if given is None and kwargs.get("text_format") is None:
        return None
    if given is None or isinstance(given, type):
        return sc.OUTPUT_JSON
    kind = field(given, "type")
    return _OUTPUT_TYPES.get(kind) if isinstance(kind, str) else None


# --- response side ---------------------------------------------------------------------------------------------


# where a usage object keeps its counts: input, output, and the details holding cached, cache-write and reasoning
# tokens (the input count includes both kinds of cached ones)
_CHAT_USAGE = ("prompt_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details")
_RESPONSES_USAGE = ("input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details")


def _read_usage(op: Operation, usage: Any, names: tuple[str, str, str, str]) -> None:
    """Counts from the client's usage object, or from its JSON as the server sent it."""
    input_key, output_key, input_details, output_details = names
    op.input_tokens = count(field(usage, input_key))
    op.output_tokens = count(field(usage, output_key))
    details = field(usage, input_details)
    cached = count(field(details, "cached_tokens"))
    if cached is not None:
        op.cache_read_tokens = cached
    written = count(field(details, "cache_write_tokens"))
    if written is not None:
        op.cache_creation_tokens = written
    reasoning = count(field(field(usage, output_details), "reasoning_tokens"))
    if reasoning is not None:
        op.reasoning_tokens = reasoning


def _read_chat_usage(op: Operation, usage: Any) -> None:
    """Usage of a chat or legacy completion."""
    _read_usage(op, usage, _CHAT_USAGE)


def _read_served(op: Operation, result: Any) -> None:
    """How OpenAI served the response: its service tier and the backend's fingerprint, where it says."""
    for name, value in ((sc.OPENAI_RESPONSE_SERVICE_TIER, getattr(result, "service_tier", None)),
                        (sc.OPENAI_RESPONSE_SYSTEM_FINGERPRINT, getattr(result, "system_fingerprint", None))):
        if isinstance(value, str) and value:
            op.attributes[name] = value


def _read_completion(op: Operation, result: Any) -> None:
    """A whole chat completion or legacy completion: ids, finish reasons, usage."""
    op.response_id = result.id
    op.response_model = result.model
    _read_served(op, result)
    op.finish_reasons = [choice.finish_reason for choice in result.choices if choice.finish_reason]
    if result.usage is not None:
        _read_chat_usage(op, result.usage)


def _usage_chunk(op: Operation, chunk: Any) -> int:
    """A chunk without choices: the usage chunk at the end of a stream (hidden when we asked for it), or nothing.
    Only an empty list of choices is that chunk's shape, as the lift reads it too: ``null`` or a string is not."""
    if chunk.usage is None or chunk.choices != []:
        if op.hide_usage_chunk and chunk.usage is None:  # OpenAI's null, where unasked it sends none
            getattr(chunk, _FIELDS_SET).discard("usage")
        return OTHER  # usage beside choices that are not a list: the server's, as on chunks of output
    _read_chat_usage(op, chunk.usage)  # whatever the server put there: the chunk is hidden all the same
    if not op.hide_usage_chunk:
        return OTHER
    if any(getattr(chunk, name, None) is not None for name in _CARRIED):
        _as_unasked(chunk)  # it carries the caller's own too: on it goes, as it would have come unasked
        return OTHER
    return HIDDEN


def _field_names(model: type) -> frozenset[str]:
    fields = getattr(model, "model_fields", None)
    return frozenset(fields if fields is not None else getattr(model, "__fields__", ()))  # pydantic 2, or 1


# What a chunk says of itself, which the usage chunk says too. The other fields of the client's chunk types carry
# something for the caller (a moderation result, in openai 3.x): a usage chunk holding one of them is not ours to
# hide. A compatible server's fields the client does not know (Groq's x_groq) go with the usage, as they came.
_CARRIED = (_field_names(ChatCompletionChunk) | _field_names(Completion)) - {
    "id", "object", "created", "model", "choices", "usage", "service_tier", "system_fingerprint", "obfuscation"}


# Where a client's model keeps the names of the fields it was given (what its to_dict() and to_json() write). A
# stream we asked usage for has "usage": null in every chunk from OpenAI; unasked, no usage field: each chunk goes
# to the caller with the field unset, as it comes unasked (~50 ns, read directly: the property costs twice that).
_FIELDS_SET = "__fields_set__" if pydantic.VERSION.startswith("1.") else "__pydantic_fields_set__"


def _output_chunk_usage(op: Operation, chunk: Any) -> None:
    """Counts on a chunk with choices, of a stream we asked usage for: read (the latest), and left where the server
    put them. Some compatible servers put them on the finishing chunk or on every chunk whether asked or not
    (llama-cpp-python's server, llama.cpp's), and we cannot tell those from counts that came because we asked. Only
    vLLM's continuous_usage_stats, which the caller asked for and only our include_usage turns on, are taken off, so
    that the chunk goes on as it comes unasked."""
    _read_chat_usage(op, chunk.usage)
    if op.hide_chunk_usage:
        chunk.usage = None  # which pydantic marks as set
        getattr(chunk, _FIELDS_SET).discard("usage")


def _as_unasked(chunk: Any) -> None:
    """A chunk of a stream we asked usage for, as it comes unasked: no usage (a compatible server's usage on the
    finishing chunk was ours), and the field unset."""
    if chunk.usage is not None:
        chunk.usage = None
    getattr(chunk, _FIELDS_SET).discard("usage")


def _finished(op: Operation, chunk: Any, choice: Any) -> int:
    """A choice finished: DONE once every choice asked for has (a server may say so again: its last reason counts).
    The reasons are in the order of the choices, as a whole completion lists them, whichever finished first."""
    reasons = op.finished_choices
    if reasons is None:
        reasons = op.finished_choices = {}
    reasons[choice.index] = choice.finish_reason
    op.finish_reasons = [choice.finish_reason] if len(reasons) == 1 else [reasons[i] for i in sorted(reasons)]
    if op.usage_lift is not None:
        op.usage_lift.install(op)
        op.usage_lift = None
    # some compatible servers put usage on the finishing chunk instead of a chunk of its own (when we asked for it,
    # _output_chunk_usage read it already)
    if chunk.usage is not None and not op.hide_usage_chunk:
        _read_chat_usage(op, chunk.usage)
    return DONE if len(reasons) >= op.request.attributes.get(sc.REQUEST_CHOICE_COUNT, 1) else OTHER


# a response's statuses before it has finished: a background response comes back queued, and no reason to finish
_UNFINISHED = frozenset(("queued", "in_progress"))


def _conversation_id(conversation: object) -> str | None:
    """The id of the conversation a response belongs to: given as the id, or as an object holding it."""
    found = conversation if isinstance(conversation, str) else field(conversation, "id")
    return found if isinstance(found, str) and found else None


def _read_responses_usage(op: Operation, response: Any) -> None:
    op.response_id = response.id
    op.response_model = response.model
    _read_served(op, response)
    conversation = _conversation_id(getattr(response, "conversation", None))
    if conversation is not None:  # also where the request named none: a stored response streamed again
        op.attributes[sc.CONVERSATION_ID] = conversation
    status = response.status
    incomplete = getattr(response, "incomplete_details", None)
    if status == "incomplete" and incomplete is not None and incomplete.reason:
        op.finish_reasons = [incomplete.reason]
    elif status and status not in _UNFINISHED:
        op.finish_reasons = [status]
    if response.usage is not None:
        _read_usage(op, response.usage, _RESPONSES_USAGE)


def _read_responses_output(output: Output, response: Any) -> None:
    """A whole Responses output, one choice: messages' text and refusals, reasoning summaries, function and custom
    tool calls, and the calls of tools the service runs (named by their type), keyed by their place in it."""
    found = output.choice()
    for key, item in enumerate(response.output or ()):
        if item.type == "message":
            for content in item.content:
                if content.type == "output_text" and content.text:
                    found.text(content.text, key)
                elif content.type == "refusal" and content.refusal:
                    found.text(content.refusal, key, sc.PART_REFUSAL)
        elif item.type == "reasoning":  # its summary, and the reasoning text itself where a server gives it
            for part in (*(item.summary or ()), *(getattr(item, "content", None) or ())):
                if part.text:
                    found.text(part.text, key, sc.PART_REASONING)
        elif item.type == "function_call":
            found.tool_call(key, item.call_id, item.name, item.arguments)
        elif item.type == "custom_tool_call":  # its input is the arguments, as chat's custom calls' are
            found.tool_call(key, item.call_id, item.name, item.input)
        else:
            found.other(key, item.type)


def _gather_extras(found: Choice, message: Any) -> None:
    """What a chat message or delta says beside its content: reasoning text (OpenAI-compatible servers' own field)
    and the transcript of audio output."""
    extra = message.model_extra
    if extra:
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            found.text(reasoning, kind=sc.PART_REASONING)
    transcript = field(getattr(message, "audio", None), "transcript")
    if isinstance(transcript, str) and transcript:
        found.text(transcript)


def _error_code(error: Any, otherwise: str) -> str:
    """error.type of a failure the service reported inside a stream: its error code."""
    code = getattr(error, "code", None)
    return code if isinstance(code, str) and code else otherwise


class _UsageLift:
    """Takes the usage chunk we asked for out of a stream before the client parses it, and reads its counts.

    Without it the client decodes that last event and builds a ChatCompletionChunk of it (about half of what a
    content chunk costs it, more than all our own work per request) only for the proxy to hide it. Installed as the
    stream's SSE decoder's ``decode`` once a choice has finished, so no chunk before pays for it: the client looks
    ``self.decode`` up per line. An event it is not sure of goes to the client as before (and the proxy hides it),
    and so does one carrying an ``error``, which is the client's to raise.
    """

    __slots__ = ("_decoder", "_op")

    def __init__(self, decoder: SSEDecoder) -> None:
        # both weakly: the decoder holds us, and a stream that ends without that event (usage on the finishing
        # chunk, a server that ignored the request, a caller that stopped) sits in the client's own reference cycle
        # until the collector runs, which must not hold the operation too
        self._decoder = weakref.ref(decoder)
        self._op: weakref.ref[Operation] | None = None

    @classmethod
    def for_stream(cls, stream: Any) -> _UsageLift | None:
        decoder = getattr(stream, "_decoder", None)
        # the client's own decoder only (one per stream, openai 1.x to 3.x): another's decode() may mean otherwise
        return cls(decoder) if type(decoder) is SSEDecoder else None

    def install(self, op: Operation) -> None:
        decoder = self._decoder()
        if decoder is not None:
            self._op = weakref.ref(op)
            decoder.decode = self  # type: ignore[method-assign]

    def __call__(self, line: str) -> Any:
        decoder = cast(SSEDecoder, self._decoder())  # alive: it is what calls us
        event = SSEDecoder.decode(decoder, line)  # the client's own decoding, its errors its own
        op = self._op() if self._op is not None else None
        if event is None or op is None or event.event is not None or '"usage"' not in event.data:
            return event
        try:
            data = json.loads(event.data)
            if not (isinstance(data, dict) and data.get("choices") == [] and isinstance(data.get("usage"), dict)
                    and not data.get("error") and all(data.get(name) is None for name in _CARRIED)):
                return event
            _read_chat_usage(op, data["usage"])
            del decoder.decode  # its work is done: the lines left go straight to the client
        except Exception:
            report_failure("usage chunk")
            return event
        return None


_NOT_SENT = not_given_markers(openai)

# arguments of a client method that are not fields of the request's body, and ours in it
_NOT_BODY = frozenset(("extra_headers", "extra_query", "extra_body", "timeout", "stream_options"))


def _holds_iterator(value: object) -> bool:
    """Whether an iterator (used up once sent) is anywhere in the arguments."""
    if hasattr(type(value), "__next__"):
        return True
    if isinstance(value, Mapping):
        return any(_holds_iterator(item) for item in value.values())
    return isinstance(value, (list, tuple)) and any(_holds_iterator(item) for item in value)


def _names_stream_options(body: object) -> bool:
    """Whether an error's body is about stream_options: OpenAI's envelope naming it as the parameter or in its
    message, or a validation error (FastAPI's ``detail``) located at it. Never what a body echoes of the request."""
    if not isinstance(body, Mapping):
        return False
    message = body.get("message")
    if body.get("param") == "stream_options" or (isinstance(message, str) and "stream_options" in message):
        return True
    detail = body.get("detail")
    return isinstance(detail, list) and any(_locates_stream_options(item) for item in detail)


def _locates_stream_options(item: object) -> bool:
    if not isinstance(item, Mapping):
        return False
    location, text = item.get("loc"), item.get("msg")
    return (isinstance(location, list) and "stream_options" in location) or (
        isinstance(text, str) and "stream_options" in text)


# --- endpoints -------------------------------------------------------------------------------------------------


class _Endpoint:
    operation = sc.OP_CHAT
    api_type: str  # openai.api.type
    prompt_keys: tuple[str, ...] = ()
    count_prompt = staticmethod(_text_chars)  # characters of text in one of them
    stream_usage = False  # does this endpoint take stream_options.include_usage?
    answers = True  # does its response hold output messages?

    def describe(self, instance: Any, kwargs: dict[str, Any], settings: Settings) -> Request:
        provider, host, port = _provider_and_server(instance)
        model = kwargs.get("model")
        chars, unread = self._prompt_chars(kwargs)
        request = Request(
            operation=self.operation,
            provider=provider,
            model=model if isinstance(model, str) else None,
            server_address=host,
            server_port=port,
            stream=streams(kwargs),
            prompt_chars=chars,
            attributes=_request_parameters(kwargs),
            client=getattr(instance, "_client", None),
        )
        request.attributes[sc.OPENAI_API_TYPE] = self.api_type
        output_type = _output_type(kwargs)
        if output_type is not None:
            request.attributes[sc.OUTPUT_TYPE] = output_type
        tier = kwargs.get("service_tier")
        if isinstance(tier, str) and tier != "auto":
            request.attributes[sc.OPENAI_REQUEST_SERVICE_TIER] = tier
        if settings.capture_content.enabled:
            request.input_messages = ct.safely(lambda: self.input_messages(kwargs))
        if unread:
            request.read_sent = lambda body: self._read_sent(request, body, settings)
        return request

    def _prompt_chars(self, values: Mapping[str, Any]) -> tuple[int | None, bool]:
        """Characters of the prompt in the arguments (or the body as sent); or None, and whether that is because
        the prompt is given as an iterator or another iterable, or holds an iterator: reading it would use it up.
        Only strings, lists and tuples are read."""
        chars: int | None = None
        for key in self.prompt_keys:
            prompt = values.get(key)
            if isinstance(prompt, (str, list, tuple)):
                counted = prompt_chars(self.count_prompt, prompt)
                if counted is None:
                    return None, True
                chars = (chars or 0) + counted
            elif prompt is not None and not isinstance(prompt, _NOT_SENT):
                return None, True
        return chars, False

    def _read_sent(self, request: Request, body: dict[str, Any], settings: Settings) -> None:
        """The prompt as the client sent it, where the caller gave an iterator: its length, and its content when
        captured."""
        request.prompt_chars = self._prompt_chars(body)[0]
        if settings.capture_content.enabled:
            request.input_messages = ct.safely(lambda: self.input_messages(body))

    def input_messages(self, kwargs: dict[str, Any]) -> list[Message]:
        raise NotImplementedError

    def prepare(self, op: Operation, kwargs: dict[str, Any], settings: Settings) -> dict[str, Any]:
        if settings.capture_content.enabled and self.answers:
            op.output = Output()
        if not (self.stream_usage and op.request.stream and settings.stream_usage):
            return kwargs
        headers = kwargs.get("extra_headers")
        if headers is not None and isinstance(headers, Mapping) and RAW_RESPONSE_HEADER in headers:
            return kwargs  # a raw response: its caller may read the SSE lines, where our chunk could not be hidden
        for value in kwargs.values():
            if hasattr(type(value), "__next__"):
                return kwargs  # an iterator (tools from a generator): a refused request could not go out again
        if (op.request.server_address, op.request.server_port) in _NO_STREAM_OPTIONS:
            return kwargs
        # The client lays extra_body over the typed arguments: a stream_options there is the one the server gets.
        # We add ours through extra_body too: a stream_options argument would cost the client ~100 us (cold) of
        # transforming its typed parameters, more than everything we do per request.
        extra = kwargs.get("extra_body")
        if extra is None:
            extra = {}
        elif not isinstance(extra, Mapping):
            return kwargs  # a body of the caller's own kind: not ours to rebuild
        options = extra.get("stream_options")
        if options is None:
            options = kwargs.get("stream_options")
        if options is None or isinstance(options, _NOT_SENT):  # null, or none: ours alone
            options = {}
        elif not isinstance(options, Mapping) or "include_usage" in options:
            return kwargs  # the caller decided, either way, or sends something of its own: not ours to rewrite
        op.hide_usage_chunk = True
        op.hide_chunk_usage = bool(options.get("continuous_usage_stats"))
        return {**kwargs, "extra_body": {**extra, "stream_options": {**options, "include_usage": True}}}

    def refused(self, op: Operation, error: Exception, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """Servers that do not take stream_options (Azure OpenAI before api-version 2024-09-01-preview, strict
        compatible gateways) answer our usage request with an error that names it: the server is remembered, and
        this call goes out again as the caller made it. Its parameters as the client sent them the first time:
        they may hold iterators (content parts from a generator) that sending used up. A body that is not JSON
        here (a client that compresses it) leaves the caller's own arguments to send."""
        if not (op.hide_usage_chunk and isinstance(error, (openai.BadRequestError, openai.UnprocessableEntityError))
                and _names_stream_options(error.body)):
            return None
        if len(_NO_STREAM_OPTIONS) >= _MAX_REMEMBERED_SERVERS:
            _NO_STREAM_OPTIONS.clear()
        _NO_STREAM_OPTIONS.add((op.request.server_address, op.request.server_port))
        op.hide_usage_chunk = False
        try:
            sent = json.loads(error.response.request.content)
        except Exception:  # not JSON, or not read into memory: the caller's own arguments, unless used up
            reraise_if_signalled()
            sent = None
        if not isinstance(sent, dict):
            return None if _holds_iterator(kwargs) else kwargs
        # the typed parameters as sent, except what extra_body overrode (its value was sent, the caller's argument
        # is what the client builds from, as Azure does the deployment from model) and stream_options (ours in it)
        extra = kwargs.get("extra_body")
        overridden = extra.keys() if isinstance(extra, Mapping) else ()
        return {**kwargs, **{key: sent[key] for key in kwargs
                             if key in sent and key not in _NOT_BODY and key not in overridden}}

    def kind(self, op: Operation, result: Any) -> Kind:
        if isinstance(result, (Stream, AsyncStream)):
            if op.hide_usage_chunk:
                op.usage_lift = _UsageLift.for_stream(result)
            return Kind.STREAM if isinstance(result, Stream) else Kind.ASYNC_STREAM
        if isinstance(result, LegacyAPIResponse):  # with_raw_response: a plain body is in before it returns
            return Kind.RESPONSE if op.request.stream else Kind.COMPLETE
        if isinstance(result, AsyncAPIResponse):
            return Kind.ASYNC_RESPONSE
        if isinstance(result, APIResponse):
            return Kind.RESPONSE
        return Kind.COMPLETE

    def read(self, op: Operation, result: Any) -> None:
        self.read_final(op, parsed_body(result) if isinstance(result, LegacyAPIResponse) else result)

    def read_final(self, op: Operation, result: Any) -> None:
        """The endpoint's final object: a completion, a response, embeddings."""
        raise NotImplementedError

    def read_error(self, op: Operation, error: BaseException) -> None:
        op.secrets = request_secrets(error, op.request.client)
        # a refused request's headers; a stream's were read when its response arrived
        if isinstance(error, openai.APIStatusError) and error.response.status_code >= 400:
            _HEADERS.read(op, error.response.headers)
            read_sent(op, error.response)

    def observe(self, op: Operation, chunk: Any) -> int:
        raise NotImplementedError

    def gather(self, op: Operation, chunk: Any) -> None:
        raise NotImplementedError


class _ChatCompletions(_Endpoint):
    api_type = sc.OPENAI_API_CHAT_COMPLETIONS
    prompt_keys = ("messages",)
    stream_usage = True

    def input_messages(self, kwargs: dict[str, Any]) -> list[Message]:
        return _chat_messages(kwargs.get("messages"))

    def read_error(self, op: Operation, error: BaseException) -> None:
        """The structured-output parser refuses an answer cut at the length limit or by the content filter: the
        answer came all the same, and the error carries it."""
        if isinstance(error, _REFUSED_ANSWER) and error.completion is not None:
            self.read_final(op, error.completion)
        else:
            super().read_error(op, error)

    def read_final(self, op: Operation, result: Any) -> None:
        _read_completion(op, result)
        if op.output is not None:
            for choice in result.choices:
                found, message = op.output.choice(choice.index), choice.message
                _gather_extras(found, message)
                if message.content:
                    found.text(message.content)
                if message.refusal:
                    found.text(message.refusal, kind=sc.PART_REFUSAL)
                for key, call in enumerate(message.tool_calls or ()):
                    function = field(call, "function") or field(call, "custom")
                    found.tool_call(key, call.id, field(function, "name"),
                                    field(function, "arguments") or field(function, "input"))
                if message.function_call is not None:
                    found.tool_call(None, None, message.function_call.name, message.function_call.arguments)
                found.finish(choice.finish_reason)

    def gather(self, op: Operation, chunk: Any) -> None:
        assert op.output is not None  # gather runs only when capture is on
        for choice in chunk.choices:
            delta = choice.delta
            found = op.output.choice(choice.index)
            if delta is None:
                found.finish(choice.finish_reason)
                continue
            _gather_extras(found, delta)
            if delta.content:
                found.text(delta.content)
            if delta.refusal:
                found.text(delta.refusal, kind=sc.PART_REFUSAL)
            for position, call in enumerate(delta.tool_calls or ()):
                function = call.function
                # by its index; some compatible servers (Gemini's) send whole calls without one: by id, or place
                key = call.index if isinstance(call.index, int) else (call.id or f"#{position}")
                found.tool_call(key, call.id, function and function.name, function and function.arguments)
            if delta.function_call is not None:
                found.tool_call(None, None, delta.function_call.name, delta.function_call.arguments)
            found.finish(choice.finish_reason)

    def observe(self, op: Operation, chunk: Any) -> int:
        choices = chunk.choices
        if not choices:
            return _usage_chunk(op, chunk)
        if op.hide_usage_chunk:  # first: a chunk we then fail to read goes on as it comes unasked all the same
            if chunk.usage is None:  # OpenAI's null, where unasked it sends none
                getattr(chunk, _FIELDS_SET).discard("usage")
            else:
                _output_chunk_usage(op, chunk)
        if op.response_id is None:
            op.response_id, op.response_model = chunk.id, chunk.model
            _read_served(op, chunk)
        kind = OTHER
        for choice in choices:
            delta = choice.delta  # None in some servers' finishing chunks and Azure's content-filter annotations
            if delta is None:
                pass
            elif delta.content or delta.tool_calls or delta.refusal or delta.function_call:
                kind = CONTENT  # the finish that makes a chunk DONE comes after its content
            elif delta.model_extra and (delta.model_extra.get("reasoning_content")
                                        or delta.model_extra.get("reasoning")):
                kind = CONTENT  # reasoning deltas of OpenAI-compatible servers (vLLM, DeepSeek, ...)
                op.reasoning_streamed = True
            elif (audio := getattr(delta, "audio", None)) and (field(audio, "transcript") or field(audio, "data")):
                kind = CONTENT  # audio output (modalities=["text", "audio"]): transcript and data deltas
            if choice.finish_reason:
                kind |= _finished(op, chunk, choice)
        return kind


class _Responses(_Endpoint):
    api_type = sc.OPENAI_API_RESPONSES
    prompt_keys = ("instructions", "input")

    def describe(self, instance: Any, kwargs: dict[str, Any], settings: Settings) -> Request:
        request = super().describe(instance, kwargs, settings)
        conversation = _conversation_id(kwargs.get("conversation"))
        if conversation is not None:
            request.attributes[sc.CONVERSATION_ID] = conversation
        instructions = kwargs.get("instructions")
        if settings.capture_content.enabled and isinstance(instructions, str) and instructions:
            request.system_instructions = [ct.text(instructions)]
        return request

    def input_messages(self, kwargs: dict[str, Any]) -> list[Message]:
        return _responses_input(kwargs.get("input"))

    def read_final(self, op: Operation, result: Any) -> None:
        _read_responses_usage(op, result)
        if op.output is not None:
            _read_responses_output(op.output, result)

    def gather(self, op: Operation, chunk: Any) -> None:
        """Text, reasoning and function calls as they stream, by their place in the output, so a stream broken off
        keeps what came; the whole output from the final event, which says every call's id and name (a failed
        response's may be empty: what streamed is kept then)."""
        assert op.output is not None  # gather runs only when capture is on
        event = chunk.type
        if event in _RESPONSES_FINAL_EVENTS:
            if chunk.response.output:
                op.output = Output()
                _read_responses_output(op.output, chunk.response)
            return
        kind = _RESPONSES_GATHERED.get(event)
        if kind is None:
            if event == "response.output_item.added":
                item_type = field(chunk.item, "type")
                if item_type in ("function_call", "custom_tool_call"):
                    op.output.choice().tool_call(chunk.output_index, chunk.item.call_id, chunk.item.name)
                elif item_type not in _RESPONSES_STREAMED_ITEMS:
                    op.output.choice().other(chunk.output_index, item_type)
        elif kind == sc.PART_TOOL_CALL:
            op.output.choice().tool_call(chunk.output_index, fragment=chunk.delta)
        else:
            op.output.choice().text(chunk.delta, chunk.output_index, kind)

    def observe(self, op: Operation, chunk: Any) -> int:
        event = chunk.type
        if event in _RESPONSES_CONTENT_EVENTS:
            if not chunk.delta:  # an empty delta carries no token
                return OTHER
            if event == "response.reasoning_text.delta":
                op.reasoning_streamed = True
            elif event == "response.reasoning_summary_text.delta" and op.summary_chunks == op.content_chunks:
                op.summary_chunks += 1  # ahead of any other output
            return CONTENT
        if event in _RESPONSES_FINAL_EVENTS:
            _read_responses_usage(op, chunk.response)
            if event == "response.failed":  # the client hands this on as an event and raises nothing
                op.error_type = _error_code(getattr(chunk.response, "error", None), "failed")
            return DONE
        if event == "error":  # the same: the service's error as an event, then the stream ends
            op.error_type = _error_code(chunk, "error")
            return DONE
        if event == "response.created":
            op.response_id = chunk.response.id
            op.response_model = chunk.response.model
        elif event in _RESPONSES_HOSTED_TOOL_DONE:
            op.waiting_on_a_tool()
        return OTHER


class _Compaction(_Responses):
    """``responses.compact()``: a model pass, billed in tokens, that shortens a conversation to its user messages and
    one encrypted compaction item. No answer, no model named in the response, never streamed."""

    answers = False

    def read_final(self, op: Operation, result: Any) -> None:
        op.response_id = result.id
        _read_served(op, result)
        if result.usage is not None:
            _read_usage(op, result.usage, _RESPONSES_USAGE)


class _Unstreamed(_Endpoint):
    """An endpoint that never streams: its chunks are never asked about."""

    def observe(self, op: Operation, chunk: Any) -> int:
        return OTHER

    def gather(self, op: Operation, chunk: Any) -> None:
        pass


# what a decision's model reads: its input (as a Responses input, with JSON parts) and its questions (instructions,
# choices, levels and their descriptions)
_decision_chars = text_counter(*_PROMPT_KEYS, "instructions", "choices", "levels", "value", "label", "description",
                               json_keys=("data",))


class _Decisions(_Unstreamed):
    """``decisions.create()``: the model answers classification and scoring questions about an input, billed in
    tokens as an answer is. Its response names the model and usage; no id and no finish reason. Its answers are
    probabilities, not messages: none are captured as output. Never streamed."""

    api_type = sc.OPENAI_API_DECISIONS
    prompt_keys = ("input", "questions")
    count_prompt = staticmethod(_decision_chars)
    answers = False

    def input_messages(self, kwargs: dict[str, Any]) -> list[Message]:
        return _responses_input(kwargs.get("input"))

    def read_final(self, op: Operation, result: Any) -> None:
        op.response_model = result.model
        if result.usage is not None:
            _read_usage(op, result.usage, _RESPONSES_USAGE)


class _Completions(_Endpoint):
    operation = sc.OP_TEXT_COMPLETION
    api_type = sc.OPENAI_API_COMPLETIONS
    prompt_keys = ("prompt",)
    stream_usage = True

    def input_messages(self, kwargs: dict[str, Any]) -> list[Message]:
        return _prompts(kwargs.get("prompt"))

    def read_final(self, op: Operation, result: Any) -> None:
        _read_completion(op, result)
        if op.output is not None:
            self.gather(op, result)

    def gather(self, op: Operation, chunk: Any) -> None:
        assert op.output is not None  # gather runs only when capture is on
        for choice in chunk.choices:
            found = op.output.choice(choice.index)
            if choice.text:
                found.text(choice.text)
            found.finish(choice.finish_reason)

    def observe(self, op: Operation, chunk: Any) -> int:
        choices = chunk.choices
        if not choices:
            return _usage_chunk(op, chunk)
        if op.hide_usage_chunk:  # as _ChatCompletions.observe
            if chunk.usage is None:  # OpenAI's null, where unasked it sends none
                getattr(chunk, _FIELDS_SET).discard("usage")
            else:
                _output_chunk_usage(op, chunk)
        if op.response_id is None:
            op.response_id, op.response_model = chunk.id, chunk.model
        kind = OTHER
        for choice in choices:
            if choice.text:
                kind = CONTENT
            if choice.finish_reason:
                kind |= _finished(op, chunk, choice)
        return kind


class _Embeddings(_Unstreamed):
    operation = sc.OP_EMBEDDINGS
    api_type = sc.OPENAI_API_EMBEDDINGS
    prompt_keys = ("input",)
    answers = False

    def input_messages(self, kwargs: dict[str, Any]) -> list[Message]:
        return _prompts(kwargs.get("input"))

    def describe(self, instance: Any, kwargs: dict[str, Any], settings: Settings) -> Request:
        request = super().describe(instance, kwargs, settings)
        encoding = kwargs.get("encoding_format")
        if isinstance(encoding, str):
            request.attributes[sc.REQUEST_ENCODING_FORMATS] = [encoding]
        dimensions = parameter(sc.EMBEDDINGS_DIMENSION_COUNT, kwargs.get("dimensions"))
        if dimensions is not None:
            request.attributes[sc.EMBEDDINGS_DIMENSION_COUNT] = dimensions
        return request

    def read_final(self, op: Operation, result: Any) -> None:
        op.response_model = result.model
        op.input_tokens = count(field(result.usage, "prompt_tokens"))


def _helper_closed(helper_stream: Any) -> None:
    closed_by_helper(raw_stream_of(helper_stream))


def _parsing_chat_completion(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``chat.completions.parse()``'s structured-output parser is about to read the completion: read its ids, finish
    reasons and usage first, since the parser raises pydantic's ValidationError on an answer that does not fit the
    format, and that error carries no completion. (Its content is read from what the call returns, or from the
    refusal that carries the completion: once.)"""
    completion = kwargs.get("chat_completion")
    if completion is not None:
        _read_completion(op, completion)


def _parsing_response(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``responses.parse()``'s structured-output parser is about to read the response: read it first, since the
    parser raises (pydantic's ValidationError) on an answer cut short, and that error carries no response."""
    response = kwargs.get("response")
    if response is not None:
        _read_responses_usage(op, response)


_CHAT, _RESPONSES, _COMPLETIONS, _EMBEDDINGS = _ChatCompletions(), _Responses(), _Completions(), _Embeddings()
_COMPACTION, _DECISIONS = _Compaction(), _Decisions()
_CHAT_MODULE = "openai.resources.chat.completions.completions"
_RESPONSES_MODULE = "openai.resources.responses.responses"
# client.beta.responses (openai 3.x): the Responses API's beta features, the same calls, events and usage
_BETA_RESPONSES_MODULE = "openai.resources.beta.responses.responses"

PROVIDER = Provider(
    name="openai",
    targets=(
        Target(_CHAT_MODULE, "Completions.create", sync_call(_CHAT)),
        Target(_CHAT_MODULE, "AsyncCompletions.create", async_call(_CHAT)),
        Target(_CHAT_MODULE, "Completions.parse", sync_call(_CHAT)),
        Target(_CHAT_MODULE, "AsyncCompletions.parse", async_call(_CHAT)),
        Target(_RESPONSES_MODULE, "Responses.create", sync_call(_RESPONSES)),
        Target(_RESPONSES_MODULE, "AsyncResponses.create", async_call(_RESPONSES)),
        Target(_RESPONSES_MODULE, "Responses.parse", sync_call(_RESPONSES)),
        Target(_RESPONSES_MODULE, "AsyncResponses.parse", async_call(_RESPONSES)),
        # a stored (background) response streamed again, whole or after an event; a retrieve that does not stream
        # fetches a stored object, and calls no model
        Target(_RESPONSES_MODULE, "Responses.retrieve", selected(sync_call(_RESPONSES), streams)),
        Target(_RESPONSES_MODULE, "AsyncResponses.retrieve", selected(async_call(_RESPONSES), streams)),
        Target(_RESPONSES_MODULE, "Responses.compact", sync_call(_COMPACTION)),
        Target(_RESPONSES_MODULE, "AsyncResponses.compact", async_call(_COMPACTION)),
        Target(_BETA_RESPONSES_MODULE, "Responses.create", sync_call(_RESPONSES)),
        Target(_BETA_RESPONSES_MODULE, "AsyncResponses.create", async_call(_RESPONSES)),
        Target(_BETA_RESPONSES_MODULE, "Responses.retrieve", selected(sync_call(_RESPONSES), streams)),
        Target(_BETA_RESPONSES_MODULE, "AsyncResponses.retrieve", selected(async_call(_RESPONSES), streams)),
        Target(_BETA_RESPONSES_MODULE, "Responses.compact", sync_call(_COMPACTION)),
        Target(_BETA_RESPONSES_MODULE, "AsyncResponses.compact", async_call(_COMPACTION)),
        Target("openai.resources.completions", "Completions.create", sync_call(_COMPLETIONS)),
        Target("openai.resources.completions", "AsyncCompletions.create", async_call(_COMPLETIONS)),
        Target("openai.resources.embeddings", "Embeddings.create", sync_call(_EMBEDDINGS)),
        Target("openai.resources.embeddings", "AsyncEmbeddings.create", async_call(_EMBEDDINGS)),
        Target("openai.resources.decisions", "Decisions.create", sync_call(_DECISIONS)),
        Target("openai.resources.decisions", "AsyncDecisions.create", async_call(_DECISIONS)),
        # headers, retries: deeper in the client, on behalf of the operation running in this context
        *_HEADERS.base_client_targets("openai"),
        # the structured-output parsers, where parse() looks them up (openai 3.x; 1.x and 2.x)
        Target("openai.lib._chat_completion_resources", "_parse_chat_completion", hook(_parsing_chat_completion)),
        Target(_CHAT_MODULE, "_parse_chat_completion", hook(_parsing_chat_completion)),
        Target("openai.lib._response_resources", "parse_response", hook(_parsing_response)),
        Target(_RESPONSES_MODULE, "parse_response", hook(_parsing_response)),
        # the stream() helpers close the HTTP response themselves, not the stream we handed them
        Target("openai.lib.streaming.chat._completions", "ChatCompletionStream.close", before(_helper_closed)),
        Target("openai.lib.streaming.chat._completions", "AsyncChatCompletionStream.close", before(_helper_closed)),
        Target("openai.lib.streaming.responses._responses", "ResponseStream.close", before(_helper_closed)),
        Target("openai.lib.streaming.responses._responses", "AsyncResponseStream.close", before(_helper_closed)),
        # and their parsers refuse an answer cut short while the caller iterates, as the calls that do not stream do
        helper_target("openai.lib.streaming.chat._completions", "ChatCompletionStream"),
        helper_target("openai.lib.streaming.chat._completions", "AsyncChatCompletionStream"),
        helper_target("openai.lib.streaming.responses._responses", "ResponseStream"),
        helper_target("openai.lib.streaming.responses._responses", "AsyncResponseStream"),
    ),
)
