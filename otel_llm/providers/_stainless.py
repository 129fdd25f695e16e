"""What the Stainless-generated clients (openai, anthropic) share: their base client hands every HTTP response to
``_process_response`` and every retry to ``_sleep_for_retry``, where response headers (rate-limit headroom,
retry-after) and retries are seen on behalf of the operation running in this context; and their raw responses,
whose body is parsed the same way."""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from otel_llm._calls import hook
from otel_llm._patching import Target
from otel_llm._redact import bearer_secrets

if TYPE_CHECKING:
    from otel_llm._operation import Operation


def parsed_body(response: Any) -> Any:
    """The object a raw response's body (read in already) stands for, before the post-parser a client's ``parse()``
    method adds for structured output: that one raises on an answer cut off or malformed, which is the caller's to
    meet when it parses (the call itself succeeded). Without a post-parser, the response's own ``parse()``, which the
    client caches for the caller; when that is a coroutine (an async response), the synchronous step under it."""
    if callable(getattr(response._options, "post_parser", None)) or inspect.iscoroutinefunction(response.parse):
        return response._parse()
    return response.parse()


# request headers and query parameters that carry the API key or token (openai, Azure OpenAI, anthropic)
_CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key", "proxy-authorization")


def request_secrets(error: BaseException) -> tuple[str, ...]:
    """The credentials the failed request carried (a client error's ``request``), for redaction."""
    request = getattr(error, "request", None)
    headers, url = getattr(request, "headers", None), getattr(request, "url", None)
    values = [value for name in _CREDENTIAL_HEADERS if headers is not None and (value := headers.get(name))]
    key = getattr(getattr(url, "params", None), "get", lambda name: None)("api-key")
    return bearer_secrets([*values, key] if isinstance(key, str) else values)


def _number(raw: bytes) -> float | None:
    try:
        return float(raw)
    except ValueError:  # an HTTP date in retry-after is not a duration we can use without guessing at clocks
        return None


class ResponseHeaders:
    """Reads one client's rate-limit headers: ``(resource, remaining header, limit header)`` per resource."""

    def __init__(self, rate_limits: Sequence[tuple[str, str, str]]) -> None:
        self._rate_limits = tuple(rate_limits)
        names = ("retry-after", "retry-after-ms", *(name for _, *pair in rate_limits for name in pair))
        self._wanted = {name.encode(): name for name in names}

    def read(self, op: Operation, headers: Any) -> None:
        """Rate-limit headroom and retry-after from the raw headers, their names lower-cased once (the client's own
        lookup by name walks every header each time)."""
        raw = getattr(headers, "raw", None)
        if not raw:
            return
        # lower-cased names to values, built at C speed: a Python step per header costs more than the lookups
        values = dict(zip(map(bytes.lower, map(itemgetter(0), raw)), map(itemgetter(1), raw), strict=True))
        found: dict[str, float] = {}
        for wanted, name in self._wanted.items():
            value = values.get(wanted)
            if value is not None:
                number = _number(value)
                if number is not None:
                    found[name] = number
        if not found:
            return
        op.rate_limits_ns = time.perf_counter_ns()
        for resource, remaining_key, limit_key in self._rate_limits:
            remaining, limit = found.get(remaining_key), found.get(limit_key)
            if remaining is not None or limit is not None:
                op.rate_limits[resource] = (remaining, limit)
        if "retry-after-ms" in found:
            op.retry_after = found["retry-after-ms"] / 1000
        elif "retry-after" in found:
            op.retry_after = found["retry-after"]

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
            self.read(op, response.headers)

    def _retrying(self, op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        op.retries += 1
        response = kwargs.get("response")
        if response is not None:
            self.read(op, response.headers)
