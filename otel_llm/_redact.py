"""What an exception event on our span says: what the SDK's ``record_exception`` writes, rendered when the operation
ends (so the exception's frames are not kept while its span waits to be written). The SDK writes an exception's
message and stack trace as they are; two kinds of text in them must not leave the process through us: an answer
that the client's parser quotes (pydantic's validation errors show the input they refused, so a structured answer
cut short appears in full) when content capture does not put content on the span, and a credential a server echoes
in its error message ("Invalid API key: sk-..."), which an adapter finds on the failed request."""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Sequence

from otel_llm._safety import reraise_if_signalled

REDACTED = "[REDACTED]"


def exception_event(exception: BaseException, secrets: Sequence[str], hide_content: bool) -> dict[str, str]:
    """The attributes of the SDK's exception event for ``exception``, its message and stack trace without content
    (``hide_content``) or any of ``secrets``."""
    kind = type(exception)
    module = kind.__module__
    message, stacktrace = str(exception), _stacktrace(exception)
    for error in _chain(exception):
        if hide_content and _quotes_input(error) and (text := str(error)):
            quoted = _without_input(error)
            message, stacktrace = message.replace(text, quoted), stacktrace.replace(text, quoted)
    for secret in secrets:
        message, stacktrace = message.replace(secret, REDACTED), stacktrace.replace(secret, REDACTED)
    return {"exception.type": f"{module}.{kind.__qualname__}" if module and module != "builtins" else kind.__qualname__,
            "exception.message": message, "exception.stacktrace": stacktrace, "exception.escaped": "False"}


def bearer_secrets(values: Sequence[str]) -> tuple[str, ...]:
    """Header values that authenticate a request, and a bearer token alone as a server may quote it; longest first,
    so a value is redacted whole before a token inside it."""
    found = set()
    for value in values:
        if len(value) >= 8:
            found.add(value)
        scheme, _, token = value.partition(" ")
        if scheme.lower() in ("bearer", "basic") and len(token) >= 8:
            found.add(token)
    return tuple(sorted(found, key=len, reverse=True))


def _chain(exception: BaseException) -> Iterator[BaseException]:
    """The exception and those it was raised from or during, as a stack trace shows them."""
    seen: set[int] = set()
    pending = [exception]
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        pending += [linked for linked in (error.__cause__, error.__context__) if linked is not None]


def _quotes_input(error: BaseException) -> bool:
    """pydantic's ValidationError (v2; the clients' parsers raise it) quotes the values it refused."""
    kind = type(error)
    return kind.__name__ == "ValidationError" and kind.__module__.startswith(("pydantic", "pydantic_core"))


def _without_input(error: BaseException) -> str:
    """A ValidationError's message as pydantic writes it, without the values it refused."""
    try:
        errors = error.errors(include_input=False, include_url=False)  # type: ignore[attr-defined]
        lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''} for {error.title}"]  # type: ignore[attr-defined]
        for found in errors:
            lines += [".".join(map(str, found["loc"])) or "(root)", f"  {found['msg']} [type={found['type']}]"]
        return "\n".join(lines)
    except Exception:  # another ValidationError than pydantic's v2: its name only
        reraise_if_signalled()
        return type(error).__name__


def _stacktrace(exception: BaseException) -> str:
    return "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
