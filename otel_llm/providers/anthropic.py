"""The anthropic client: what its calls, responses, stream events and headers mean, as plain values. No spans, no
meters.

Covers ``messages.create`` (streamed and not), ``messages.parse`` and the ``messages.stream()`` helper, and the same
three of ``beta.messages``, sync and async, including ``with_raw_response`` and ``with_streaming_response``, for
``Anthropic`` and the platform clients that share its ``Messages`` resource (``AnthropicBedrock`` -> ``aws.bedrock``,
``AnthropicVertex`` -> ``gcp.vertex_ai``). The first token is the first non-empty text, tool-input or thinking
delta, never ``message_start``. Input tokens include cache reads and writes, which are reported on their own too.
Headroom comes from the ``anthropic-ratelimit-*`` headers.

The stream() helper sends its request only when its manager is entered, through a partial (or coroutine) of the
client's ``post``, not through ``create``: its deferred request is routed through our wrapper instead. The helper's
own close path (``MessageStream.close`` -> ``Stream.close``) and its iteration go through the raw stream it holds,
which is then our proxy, so ``text_stream``, ``get_final_message()`` and early exits need nothing more; what its
own parser raises on an answer cut short (``output_format``) is seen around its events (``helper_target``).

The SDK's own span. anthropic 2.x opens a CLIENT span ``anthropic.messages.create`` (scope
``com.anthropic.sdk.python``) for every API call, on the global tracer provider unless told otherwise
(``open_telemetry`` client option, ``ANTHROPIC_OPEN_TELEMETRY*`` variables), ends it when the body has been read,
closed or dropped, and sends its trace context as ``traceparent`` with each attempt. Beside ours that would be two
GenAI spans per operation. While one of our operations runs, the SDK's ``start_api_call_span`` gets a stand-in for
our span instead (``_calls.span_stand_in``): a non-recording span with our span's context. So there is one span,
ours, with our attributes and linked to our metrics; the SDK still propagates the trace context, now naming our
span; and it does no span work of its own (it skips that for a non-recording span). Attributes only the SDK records
(``anthropic.request.id``, ``url.*``, ``http.*``) are not on our span, and the SDK's content mode does not apply
(ours is ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``). A client whose spans are off
(``open_telemetry=False``) is left as it is: no span and no propagation. Calls we do not instrument (count_tokens,
batches, models, ...) keep the SDK's span.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any

import anthropic
from anthropic import AsyncStream, Stream
from anthropic._response import APIResponse, AsyncAPIResponse

from otel_llm import _content as ct
from otel_llm import _semconv as sc
from otel_llm._calls import Kind, Wrapper, async_call, hook, span_stand_in, sync_call
from otel_llm._content import Output
from otel_llm._operation import Request
from otel_llm._patching import Provider, Target
from otel_llm._safety import report_failure
from otel_llm._stream import CONTENT, DONE, OTHER
from otel_llm.providers import _claude
from otel_llm.providers._stainless import (
    ResponseHeaders,
    helper_target,
    not_given_markers,
    parsed_body,
    read_sent,
    request_secrets,
)
from otel_llm.providers._values import count, field, parameter, prompt_chars, streams, text_counter

try:  # the SDK's table of exception classes by (status, error code), which names a stream's error events
    from anthropic._error_classes import ERROR_CLASSES as _ERROR_CLASSES
    from anthropic._exceptions import extract_error_code as _error_code
except ImportError:
    _ERROR_CLASSES = {}

if TYPE_CHECKING:
    from otel_llm._operation import Operation
    from otel_llm._settings import Settings
    from otel_llm._telemetry import Telemetry

# what the SDK's clients call themselves (``_gen_ai_provider_name``); anything else counts as Anthropic's own API
_PROVIDERS = frozenset({sc.PROVIDER_ANTHROPIC, sc.PROVIDER_AWS_BEDROCK, sc.PROVIDER_GCP_VERTEX_AI})

_HEADERS = ResponseHeaders(tuple(
    (resource, f"anthropic-ratelimit-{name}-remaining", f"anthropic-ratelimit-{name}-limit")
    for resource, name in (
        (sc.RATE_LIMIT_REQUESTS, "requests"),
        (sc.RATE_LIMIT_TOKENS, "tokens"),
        (sc.RATE_LIMIT_INPUT_TOKENS, "input-tokens"),
        (sc.RATE_LIMIT_OUTPUT_TOKENS, "output-tokens"),
    )
))


# --- request side ----------------------------------------------------------------------------------------------


# request parameters the conventions name, by the API's names
_SAMPLING = (("max_tokens", sc.REQUEST_MAX_TOKENS), ("temperature", sc.REQUEST_TEMPERATURE),
             ("top_p", sc.REQUEST_TOP_P), ("top_k", sc.REQUEST_TOP_K))

# a prompt's text: a message's or tool result's content, a block's text, and an earlier tool call's input (JSON)
_text_chars = text_counter("content", "text", json_keys=("input",))
_NOT_SENT = not_given_markers(anthropic)


def _prompt_chars(values: Mapping[str, Any]) -> tuple[int | None, bool]:
    """Characters of the system prompt and messages in the arguments (or the body as sent); or None, and whether
    that is because they are given as an iterator or another iterable, or hold an iterator: reading it would use it
    up. Only strings, lists and tuples are read."""
    prompt = []
    for key in ("system", "messages"):
        value = values.get(key)
        if isinstance(value, (str, list, tuple)):
            prompt.append(value)
        elif value is not None and not isinstance(value, _NOT_SENT):
            return None, True
    if not prompt:
        return None, False
    chars = prompt_chars(_text_chars, prompt)
    return chars, chars is None


def _capture(request: Request, values: Mapping[str, Any]) -> None:
    request.system_instructions = ct.safely(lambda: _claude.system_instructions(values.get("system")))
    request.input_messages = ct.safely(lambda: _claude.messages(values.get("messages")))


def _read_sent(request: Request, body: dict[str, Any], settings: Settings) -> None:
    """The prompt as the client sent it, where the caller gave an iterator: its length, and its content when
    captured."""
    request.prompt_chars = _prompt_chars(body)[0]
    if settings.capture_content.enabled:
        _capture(request, body)


def _describe(instance: Any, kwargs: Mapping[str, Any], settings: Settings, *, stream: bool) -> Request:
    client = instance._client
    url = client.base_url
    name = getattr(client, "_gen_ai_provider_name", None)
    model = kwargs.get("model")
    chars, unread = _prompt_chars(kwargs)
    attributes: dict[str, Any] = {}
    extra = kwargs.get("extra_body")
    # sampling parameters: arguments of older releases; 2.15 has none, so a caller sends them in extra_body
    given = {**kwargs, **extra} if isinstance(extra, Mapping) else kwargs
    for key, attribute in _SAMPLING:
        value = parameter(attribute, given.get(key))
        if value is not None:
            attributes[attribute] = value
    stop = kwargs.get("stop_sequences")
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        attributes[sc.REQUEST_STOP_SEQUENCES] = list(stop)
    # structured output: output_config's format, or the class .parse() is given (output_format)
    if field(field(kwargs.get("output_config"), "format"), "type") == "json_schema" or isinstance(
            kwargs.get("output_format"), type):
        attributes[sc.OUTPUT_TYPE] = sc.OUTPUT_JSON
    request = Request(
        operation=sc.OP_CHAT,
        provider=name if name in _PROVIDERS else sc.PROVIDER_ANTHROPIC,
        model=model if isinstance(model, str) else None,
        # empty where the client learns its URL from its first request (AnthropicGoogleCloud with default
        # credentials): then the server is the one the response comes from (_stainless)
        server_address=url.host or None,
        server_port=(url.port or (443 if url.scheme == "https" else 80)) if url.host else None,
        stream=stream,
        prompt_chars=chars,
        attributes=attributes,
        client=client,
    )
    if settings.capture_content.enabled:
        _capture(request, kwargs)
    if unread:
        request.read_sent = lambda body: _read_sent(request, body, settings)
    return request


# --- response side ---------------------------------------------------------------------------------------------


def _read_usage(op: Operation, usage: Any, *, final: bool) -> None:
    """Anthropic counts input without the cache; the conventions count it in and report the cache parts too.
    A ``message_delta`` may repeat the input counts (cumulative) or leave them out; ``message_start`` has only a
    placeholder for output, so output is read from final usage only."""
    cache_read = count(field(usage, "cache_read_input_tokens"))
    cache_creation = count(field(usage, "cache_creation_input_tokens"))
    if cache_read is not None:
        op.cache_read_tokens = cache_read
    if cache_creation is not None:
        op.cache_creation_tokens = cache_creation
    input_tokens = count(field(usage, "input_tokens"))
    if input_tokens is not None:
        op.input_tokens = input_tokens + (op.cache_read_tokens or 0) + (op.cache_creation_tokens or 0)
    if final:
        op.output_tokens = count(field(usage, "output_tokens"))
        reasoning = count(field(field(usage, "output_tokens_details"), "thinking_tokens"))
        if reasoning is not None:
            op.reasoning_tokens = reasoning


# An error event inside a stream comes on the stream's 200 response, so the SDK raises every one of them as its base
# APIStatusError. error.type names it as the SDK names the same error when it is the response's status instead: its
# class for that status and the error's code (https://docs.claude.com/en/api/errors). Others keep the class name.
_STREAM_ERROR_STATUS: Mapping[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "conflict_error": 409,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def _stream_error_type(error: anthropic.APIStatusError) -> str | None:
    kind = error.type
    if not isinstance(kind, str) or not kind:
        return None
    status = _STREAM_ERROR_STATUS.get(kind)
    if status is None:
        # AnthropicBedrock turns an AWS exception frame into an error event of that code (throttlingException):
        # named as a boto3 client's are, ThrottlingException
        return kind[0].upper() + kind[1:] if kind.endswith("Exception") else None
    if not _ERROR_CLASSES:
        return None
    found = _ERROR_CLASSES.get((status, _error_code(error.body))) or _ERROR_CLASSES.get((status, None))
    if found is None:
        return "InternalServerError" if status >= 500 else None
    return found.__name__


class _Messages:
    """``messages.create`` and ``messages.parse``: the request is in the keyword arguments."""

    def describe(self, instance: Any, kwargs: dict[str, Any], settings: Settings) -> Request:
        return _describe(instance, kwargs, settings, stream=streams(kwargs))

    def prepare(self, op: Operation, kwargs: dict[str, Any], settings: Settings) -> dict[str, Any]:
        if settings.capture_content.enabled:
            op.output = Output()
        return kwargs

    def kind(self, op: Operation, result: Any) -> Kind:
        if isinstance(result, Stream):
            return Kind.STREAM
        if isinstance(result, AsyncStream):
            return Kind.ASYNC_STREAM
        if isinstance(result, (APIResponse, AsyncAPIResponse)):
            # with_raw_response has read a plain body before it returns; with_streaming_response and streams have not
            if result.http_response.is_closed and not op.request.stream:
                return Kind.COMPLETE
            return Kind.ASYNC_RESPONSE if isinstance(result, AsyncAPIResponse) else Kind.RESPONSE
        return Kind.COMPLETE

    def read(self, op: Operation, result: Any) -> None:
        if isinstance(result, (APIResponse, AsyncAPIResponse)):
            result = parsed_body(result)
        _read_message(op, result)
        if op.output is not None:
            _claude.read_content(op.output, result.content)

    def refused(self, op: Operation, error: Exception, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        return None  # prepare() adds nothing to the request

    def read_error(self, op: Operation, error: BaseException) -> None:
        op.secrets = request_secrets(error, op.request.client)
        if not isinstance(error, anthropic.APIStatusError):
            return
        if error.response.status_code < 400:  # an error event inside a stream: its headers were read on arrival
            op.error_type = _stream_error_type(error)
        else:
            _HEADERS.read(op, error.response.headers)
            read_sent(op, error.response)

    def observe(self, op: Operation, chunk: Any) -> int:
        event = chunk.type
        if event == "content_block_delta":
            delta = chunk.delta
            kind = delta.type
            if kind == "text_delta":
                return CONTENT if delta.text else OTHER
            if kind == "input_json_delta":
                return CONTENT if delta.partial_json else OTHER
            if kind == "thinking_delta":
                if not delta.thinking:
                    return OTHER
                op.reasoning_streamed = True  # the thinking tokens are among those streamed
                return CONTENT
            if kind == "signature_delta":
                _claude.signature_arrived(op)
            return OTHER  # signature and citations deltas carry no output tokens
        if event == "message_start":
            message = chunk.message
            op.response_id = message.id
            op.response_model = message.model
            _read_usage(op, message.usage, final=False)
        elif event == "message_delta":
            _read_usage(op, chunk.usage, final=True)
            if chunk.delta.stop_reason:  # output and usage are complete: message_stop alone follows
                op.finish_reasons = [chunk.delta.stop_reason]
                return DONE
        elif event == "message_stop":
            return DONE
        elif event == "content_block_start":
            _claude.block_started(op, chunk.content_block.type)
        return OTHER

    def gather(self, op: Operation, chunk: Any) -> None:
        assert op.output is not None  # gather runs only when capture is on
        _claude.gather_event(op.output, chunk)


class _StreamHelper(_Messages):
    """``messages.stream()``: always streamed. The request was built by stream(); entering the manager sends it."""

    def describe(self, instance: Any, kwargs: dict[str, Any], settings: Settings) -> Request:
        return _describe(instance, kwargs, settings, stream=True)


def _sent_on_enter(call: Callable[[Telemetry], Wrapper], request_attribute: str, *,
                   awaited: bool) -> Callable[[Telemetry], Wrapper]:
    """The operation of a stream() helper begins when its manager is entered: the manager's deferred request is
    swapped for the same request sent through ``call``'s wrapper. The sync manager calls what it holds; the async one
    awaits a coroutine that stream() made."""

    def make(telemetry: Telemetry) -> Wrapper:
        send = call(telemetry)

        def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            manager = wrapped(*args, **kwargs)
            try:
                request = getattr(manager, request_attribute)
                # the request holds its arguments already: the keywords are for describing it
                if awaited:
                    deferred: Any = _SentWhenAwaited(lambda: send(lambda **_: request, instance, (), kwargs))
                else:
                    deferred = functools.partial(send, lambda **_: request(), instance, (), kwargs)
                setattr(manager, request_attribute, deferred)
            except Exception:
                report_failure("stream helper")
            return manager

        return wrapper

    return make


class _SentWhenAwaited:
    """The async manager's request, sent through our wrapper once the manager awaits it: a manager never entered
    leaves only the client's own coroutine unawaited (and warned about), as without us."""

    __slots__ = ("_send",)

    def __init__(self, send: Callable[[], Awaitable[Any]]) -> None:
        self._send = send

    def __await__(self) -> Generator[Any, None, Any]:
        return self._send().__await__()


_MESSAGES, _STREAM_HELPER = _Messages(), _StreamHelper()
def _read_message(op: Operation, message: Any) -> None:
    """A whole message: ids, stop reason, usage."""
    op.response_id = message.id
    op.response_model = message.model
    if message.stop_reason:
        op.finish_reasons = [message.stop_reason]
    _read_usage(op, message.usage, final=True)


def _parsing_message(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``parse()``'s structured-output parser is about to read the message: read it first, since the parser raises
    pydantic's ValidationError on an answer cut short or not in the format, and that error carries no message. (Its
    content is read from what the call returns: once.)"""
    message = kwargs.get("response")
    if message is not None:
        _read_message(op, message)


_MESSAGES_MODULE = "anthropic.resources.messages.messages"
# client.beta.messages: the same shapes, Beta-named; the Bedrock and Vertex clients' beta resources hold copies of
# its methods taken at import, so they are patched where they are
_BETA_MODULES = ("anthropic.resources.beta.messages.messages", "anthropic.lib.bedrock._beta_messages",
                 "anthropic.lib.vertex._beta_messages")


def _messages_targets(module: str, managers: tuple[str, str]) -> tuple[Target, ...]:
    """create, parse and stream() of one Messages resource; ``managers``: the private attribute holding each stream
    manager's deferred request (sync, async)."""
    return (
        Target(module, "Messages.create", sync_call(_MESSAGES)),
        Target(module, "AsyncMessages.create", async_call(_MESSAGES)),
        Target(module, "Messages.parse", sync_call(_MESSAGES)),
        Target(module, "AsyncMessages.parse", async_call(_MESSAGES)),
        Target(module, "Messages.stream", _sent_on_enter(sync_call(_STREAM_HELPER), managers[0], awaited=False)),
        Target(module, "AsyncMessages.stream", _sent_on_enter(async_call(_STREAM_HELPER), managers[1], awaited=True)),
    )


PROVIDER = Provider(
    name="anthropic",
    targets=(
        *_messages_targets(_MESSAGES_MODULE, ("_MessageStreamManager__api_request",
                                              "_AsyncMessageStreamManager__api_request")),
        *(target for module in _BETA_MODULES for target in _messages_targets(module, (
            "_BetaMessageStreamManager__api_request", "_BetaAsyncMessageStreamManager__api_request"))),
        # headers, retries and the SDK's own span: deeper in the client, on behalf of the operation in this context
        *_HEADERS.base_client_targets("anthropic"),
        Target("anthropic._base_client", "start_api_call_span", span_stand_in()),
        # parse()'s structured-output parsers, where it looks them up (the Bedrock and Vertex copies' too)
        Target(_MESSAGES_MODULE, "parse_response", hook(_parsing_message)),
        Target(_BETA_MODULES[0], "parse_beta_response", hook(_parsing_message)),
        # the stream() helpers' parsers refuse an answer cut short (output_format) while the caller iterates
        *(helper_target(f"anthropic.lib.streaming._{module}", helper) for module, helpers in (
            ("messages", ("MessageStream", "AsyncMessageStream")),
            ("beta_messages", ("BetaMessageStream", "BetaAsyncMessageStream"))) for helper in helpers),
    ),
)
