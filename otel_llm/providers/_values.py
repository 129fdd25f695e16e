"""Plain values out of what a client or server handed over. The clients build response objects without
validating them, so a count may arrive as anything the server sent: what is not a number is not recorded."""

from __future__ import annotations

from typing import Any


def number(value: object) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def count(value: object) -> int | None:
    """A whole number of things, 0 or more; some compatible servers write it as a float (12.0)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def field(value: Any, name: str) -> Any:
    """``value[name]`` of a JSON object, ``value.name`` of a client's object; None when it has no such field."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)
