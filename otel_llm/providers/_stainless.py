"""What the Stainless-generated clients (openai, anthropic) share: their base client hands every HTTP response to
``_process_response`` and every retry to ``_sleep_for_retry``, where response headers (rate-limit headroom,
retry-after) and retries are seen on behalf of the operation running in this context; their raw responses, whose
body is parsed the same way; and their stream() helpers, each built on the raw stream it holds."""

from __future__ import annotations

import importlib
import inspect
import json
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from otel_llm import _semconv as sc
from otel_llm._calls import Wrapper, helper_stream, hook
from otel_llm._patching import Target
from otel_llm._redact import bearer_secrets
from otel_llm._safety import reraise_if_signalled

if TYPE_CHECKING:
    from otel_llm._operation import Operation
    from otel_llm._telemetry import Telemetry


def not_given_markers(client: ModuleType) -> tuple[type, ...]:
    """The client's markers of an argument not given, which it leaves out of the body (``NotGiven``; ``Omit``,
    which openai 1.x has not)."""
    return tuple(kind for kind in (getattr(client, "NotGiven", None), getattr(client, "Omit", None))
                 if isinstance(kind, type))


def read_sent(op: Operation, response: Any) -> None:
    """Hands the body the client sent, as JSON, to what the adapter could not read of the arguments before the
    call (``Request.read_sent``): once per operation, at the first response (a retried one, an error's)."""
    reader = op.request.read_sent
    if reader is None:
        return
    op.request.read_sent = None
    try:
        body = json.loads(response.request.content)
    except Exception:  # a body not read into memory, or not JSON: left unread
        reraise_if_signalled()
        return
    if isinstance(body, dict):
        reader(body)


def parsed_body(response: Any) -> Any:
    """The object a raw response's body (read in already) stands for, before the post-parser a client's ``parse()``
    method adds for structured output: that one raises on an answer cut off or malformed, which is the caller's to
    meet when it parses (the call itself succeeded). Without a post-parser, the response's own ``parse()``, which the
    client caches for the caller; when that is a coroutine (an async response), the synchronous step under it."""
    if callable(getattr(response._options, "post_parser", None)) or inspect.iscoroutinefunction(response.parse):
        return response._parse()
    return response.parse()


def helper_target(module: str, helper: str) -> Target:
    """A stream() helper's generator of events over the raw stream it holds: its parser's refusals fail the
    operation (``_calls.helper_stream``)."""
    return Target(module, f"{helper}.__stream__", _HELPER_STREAM)


def raw_stream_of(helper: Any) -> Any:
    """The raw stream under a stream() helper: its iteration and close go through it."""
    return getattr(helper, "_raw_stream", None)


_HELPER_STREAM: Callable[[Telemetry], Wrapper] = helper_stream(raw_stream_of)

# request headers and query parameters that carry the API key or token (openai, Azure OpenAI, anthropic)
_CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key", "proxy-authorization")


# where a stainless client keeps its credentials: openai's api_key, anthropic's api_key and auth_token
_CREDENTIAL_FIELDS = ("api_key", "auth_token")


def request_secrets(error: BaseException, client: Any) -> tuple[str, ...]:
    """The credentials the failed request carried (a client error's ``request``) and the client's own (an error of
    the caller's, a request hook's, may quote them with no request to show), for redaction."""
    request = getattr(error, "request", None)
    headers, url = getattr(request, "headers", None), getattr(request, "url", None)
    values = [value for name in _CREDENTIAL_HEADERS if headers is not None and (value := headers.get(name))]
    key = getattr(getattr(url, "params", None), "get", lambda name: None)("api-key")
    if isinstance(key, str):
        values.append(key)
    values.extend(value for name in _CREDENTIAL_FIELDS if isinstance(value := getattr(client, name, None), str))
    defaults = getattr(client, "default_headers", None)  # the auth headers it makes, and the caller's own
    if isinstance(defaults, Mapping):
        values.extend(value for name, value in defaults.items()
                      if isinstance(name, str) and name.lower() in _CREDENTIAL_HEADERS and isinstance(value, str))
    return bearer_secrets(values)


def _listed_headers() -> tuple[type, ...]:
    """The header classes of httpx and httpx2, which keep each header's name lower-cased beside it (``_list``)."""
    found = []
    for package in ("httpx", "httpx2"):
        try:
            headers = importlib.import_module(package).Headers
        except (ImportError, AttributeError):
            continue
        listed = getattr(headers([("X-A", "1")]), "_list", None)
        if listed == [(b"X-A", b"x-a", b"1")]:  # as read here, or not at all
            found.append(headers)
    return tuple(found)


_LISTED_HEADERS = frozenset(_listed_headers())


_RETRY_AFTER, _RETRY_AFTER_MS = b"retry-after", b"retry-after-ms"


def _server_of(op: Operation, response: Any) -> None:
    """The server a response came from, for an operation whose client did not know it when the call began: on its
    metric points, and on its span (which started without it)."""
    url: Any = getattr(getattr(response, "request", None), "url", None)
    host, port = getattr(url, "host", None), getattr(url, "port", None)
    if isinstance(host, str) and host:
        request = op.request
        request.server_address = op.attributes[sc.SERVER_ADDRESS] = host
        request.server_port = op.attributes[sc.SERVER_PORT] = (
            port if isinstance(port, int) else 443 if getattr(url, "scheme", None) == "https" else 80)


class ResponseHeaders:
    """Reads one client's rate-limit headers: ``(resource, remaining header, limit header)`` per resource."""

    def __init__(self, rate_limits: Sequence[tuple[str, str, str]]) -> None:
        self._rate_limits = tuple((resource, remaining.encode(), limit.encode())
                                  for resource, remaining, limit in rate_limits)
        self._wanted = frozenset(name for _, *pair in self._rate_limits for name in pair) | {_RETRY_AFTER,
                                                                                              _RETRY_AFTER_MS}

    def read(self, op: Operation, headers: Any) -> None:
        """Rate-limit headroom and retry-after from the raw headers, their names lower-cased once (the client's own
        lookup by name walks every header each time). Plain loops: a dict of every header, even built at C speed,
        costs more than a step per header."""
        if type(headers) in _LISTED_HEADERS:  # (name, lower-cased name, value) each: the lower-cased names are in
            listed = headers._list
        else:
            raw = getattr(headers, "raw", None)
            if not raw:
                return
            listed = [(name, name.lower(), value) for name, value in raw]
        wanted = self._wanted
        found: dict[bytes, float] = {}
        for _, name, value in listed:
            if name in wanted:  # a header given twice: its last value counts
                try:
                    found[name] = float(value)
                except ValueError:  # an HTTP date in retry-after: not a duration we can use without guessing at clocks
                    found.pop(name, None)
        if not found:
            return
        op.rate_limits_ns = time.perf_counter_ns()
        for resource, remaining_key, limit_key in self._rate_limits:
            remaining, limit = found.get(remaining_key), found.get(limit_key)
            if remaining is not None or limit is not None:
                op.rate_limits[resource] = (remaining, limit)
        if _RETRY_AFTER_MS in found:
            op.retry_after = found[_RETRY_AFTER_MS] / 1000
        elif _RETRY_AFTER in found:
            op.retry_after = found[_RETRY_AFTER]

    def base_client_targets(self, package: str) -> tuple[Target, ...]:
        """Hooks on ``{package}._base_client``: headers when a response arrives, and each retry."""
        module = f"{package}._base_client"
        return tuple(
            Target(module, f"{client}.{method}", hook(observe))
            for client in ("SyncAPIClient", "AsyncAPIClient")
            for method, observe in (("_process_response", self._response_arrived), ("_sleep_for_retry", self._retrying))
        )

    def _response_arrived(self, op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        op.headers_ns = op.last_activity_ns = time.perf_counter_ns()
        response = kwargs.get("response")
        if response is not None:
            if op.request.server_address is None:
                _server_of(op, response)
            self.read(op, response.headers)
            if op.request.read_sent is not None:
                read_sent(op, response)

    def _retrying(self, op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        op.retries += 1
        response = kwargs.get("response")
        if response is not None:
            self.read(op, response.headers)
            if op.request.read_sent is not None:
                read_sent(op, response)
