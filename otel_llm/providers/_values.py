"""Plain values out of what a client or server handed over. The clients build response objects without
validating them, so a count may arrive as anything the server sent: what is not a number is not recorded."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from otel_llm import _semconv as sc
from otel_llm._safety import reraise_if_signalled


def number(value: object) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def parameter(name: str, value: object) -> float | int | None:
    """A request parameter the caller passed, as the conventions type it: a double (``temperature=0`` is 0.0, so
    one attribute keeps one type) or an int; what is not a number, or no whole one where an int is due, is not
    recorded."""
    found = number(value)
    if found is None or name in sc.DOUBLE_PARAMETERS:
        return None if found is None else float(found)
    if isinstance(found, float):
        return int(found) if found.is_integer() else None
    return found


def streams(kwargs: Mapping[str, Any]) -> bool:
    """Whether a call streams, as the stainless clients decide it (``stream or False``): any true value, not only
    True; their NOT_GIVEN and omit are false."""
    value = kwargs.get("stream")
    if value is True or value is None or value is False:
        return value is True
    try:
        return bool(value)
    except Exception:  # the client's own test of it raises the same to the caller
        reraise_if_signalled()
        return False


# No count of one call comes near a trillion. Past it a value is a server's garbage, and OTLP's int64 must hold
# sums of counts (input with its cache parts, a token counter's running total): one past it fails every export.
_MAX_COUNT = 10**12


def count(value: object) -> int | None:
    """A whole number of things, 0 to a trillion; some compatible servers write it as a float (12.0)."""
    if type(value) is int:  # nearly always: no type walk
        return value if 0 <= value <= _MAX_COUNT else None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        return None
    return value


def field(value: Any, name: str) -> Any:
    """``value[name]`` of a JSON object (a dict, or any Mapping a caller passes), ``value.name`` of a client's
    object; None when it has no such field. The Mapping ABC is asked only when the attribute is not there."""
    if isinstance(value, dict):
        return value.get(name)
    found = getattr(value, name, None)
    if found is None and value is not None and isinstance(value, Mapping):
        return value.get(name)
    return found


class HoldsIterator(Exception):
    """Raised by a ``text_counter`` that meets an iterator (content parts from a generator): counting it would use
    up what the client has yet to send."""


def text_counter(*keys: str, json_keys: tuple[str, ...] = ()) -> Callable[[object], int]:
    """How many characters of text a prompt holds: a string, the values under ``keys`` of a dict or attributes of an
    object (a message or block passed back as the client returned it), through lists. Under ``json_keys`` sits a
    JSON value the model reads as such (a tool call's input passed back): its length as the client sends it. It runs
    before every call over the whole conversation: the first key (where a message keeps its text) is read first,
    the others not in a bare ``{"role", "content"}`` message, and no Mapping ABC is asked per message. An iterator
    anywhere in it raises ``HoldsIterator``."""
    first = keys[0]

    def count(value: object) -> int:
        if isinstance(value, str):
            return len(value)
        if isinstance(value, (list, tuple)):
            return sum(map(count, value))
        if isinstance(value, (dict, Mapping)):
            item = value.get(first)
            total = 0 if item is None else len(item) if isinstance(item, str) else count(item)
            if item is None or len(value) > 2 or "role" not in value:
                for key, counted in others:
                    if key in value:
                        total += counted(value[key])
            return total
        if value is None or isinstance(value, (int, float, bytes)):
            return 0
        if hasattr(type(value), "__next__"):
            raise HoldsIterator
        fields = getattr(value, "__dict__", None)  # a pydantic model's: looking up a field it lacks costs ~2 us
        if isinstance(fields, dict):
            return count(fields)
        return sum(counted(getattr(value, key, None)) for key, counted in ((first, count), *others))

    def count_json(value: object) -> int:
        if value is None or isinstance(value, str):
            return count(value)
        try:  # a date or the like as text, as the clients send it
            return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str))
        except (TypeError, ValueError, RecursionError):  # not JSON (a circular value: the client refuses it): its text
            return count(value)

    others = tuple((key, count) for key in keys[1:]) + tuple((key, count_json) for key in json_keys)
    return count


def prompt_chars(counter: Callable[[object], int], prompt: object) -> int | None:
    """``counter(prompt)``, or None for a prompt that holds an iterator."""
    try:
        return counter(prompt)
    except HoldsIterator:
        return None
