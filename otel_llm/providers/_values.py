"""Plain values out of what a client or server handed over. The clients build response objects without
validating them, so a count may arrive as anything the server sent: what is not a number is not recorded."""

from __future__ import annotations

from typing import Any


def number(value: object) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def field(value: Any, name: str) -> Any:
    """``value[name]`` of a JSON object, ``value.name`` of a client's object; None when it has no such field."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)
