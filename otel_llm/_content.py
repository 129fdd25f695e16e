"""Message content in the shape of the GenAI conventions' JSON schemas (gen-ai-input-messages.json,
gen-ai-output-messages.json, gen-ai-system-instructions.json), as plain values. Made only when content capture is on.

A message is ``{"role", "parts"}``; a part is a dict whose ``type`` says what it is: ``text``, ``tool_call``,
``tool_call_response``, ``reasoning``, ``uri``, ``file``, ``blob``, or the provider's own name for anything else.
Inline data (base64, data URLs, bytes) is never copied: its ``blob`` part names the modality and MIME type and
leaves ``content`` out, which the schemas' generic part admits. Provider adapters build these; telemetry writes them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

from otel_llm import _semconv as sc
from otel_llm._safety import report_failure

T = TypeVar("T")

Part = dict[str, Any]
Message = dict[str, Any]


def safely(build: Callable[[], T]) -> T | None:
    """Content built from what the caller passed: whatever shape that has, a failure here costs the content (logged
    once), never the operation's span and metrics."""
    try:
        return build()
    except Exception:
        report_failure("content")
        return None


def message(role: object, parts: list[Part], name: object = None) -> Message:
    found: Message = {"role": role if isinstance(role, str) else str(role), "parts": parts}
    if isinstance(name, str):
        found["name"] = name
    return found


def text(content: object) -> Part:
    return {"type": sc.PART_TEXT, "content": content if isinstance(content, str) else ""}


def tool_call(call_id: object, name: object, arguments: object) -> Part:
    return {"type": sc.PART_TOOL_CALL, "id": call_id if isinstance(call_id, str) else None,
            "name": name if isinstance(name, str) else None, "arguments": arguments}


def tool_call_response(call_id: object, response: object) -> Part:
    return {"type": sc.PART_TOOL_CALL_RESPONSE, "id": call_id if isinstance(call_id, str) else None,
            "response": response}


def reasoning(content: object) -> Part:
    return {"type": sc.PART_REASONING, "content": content if isinstance(content, str) else ""}


def blob(modality: str, mime_type: object = None) -> Part:
    """Inline data, described and not copied."""
    return _with_mime({"type": sc.PART_BLOB, "modality": modality}, mime_type)


def uri(modality: str, location: str, mime_type: object = None) -> Part:
    return _with_mime({"type": sc.PART_URI, "modality": modality, "uri": location}, mime_type)


def file(modality: str, file_id: str, mime_type: object = None) -> Part:
    return _with_mime({"type": sc.PART_FILE, "modality": modality, "file_id": file_id}, mime_type)


def other(kind: object) -> Part:
    """A part of a kind the conventions do not define: named by its type, its payload not copied."""
    return {"type": kind if isinstance(kind, str) and kind else "unknown"}


def linked(modality: str, location: object, mime_type: object = None) -> Part:
    """Data given as a URL: a data URL is inline data (its MIME type kept, its payload not), any other a ``uri``."""
    if not isinstance(location, str):
        return other(modality)
    if location.startswith("data:"):
        media = location[5:].partition(",")[0].partition(";")[0]
        return blob(modality, media or mime_type)
    return uri(modality, location, mime_type)


def listed(value: object) -> list[Any] | tuple[Any, ...]:
    """A list or tuple as it is; anything else, nothing: an iterator (a generator the caller passed) would be used
    up here, before the client reads it to build the request."""
    return value if isinstance(value, (list, tuple)) else ()


def arguments(raw: object) -> object:
    """Tool-call arguments: the JSON the model wrote, decoded when it decodes, else as written."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return plain(raw)


def plain(value: object) -> object:
    """A JSON-friendly copy (tool inputs and results): a caller changing its objects later must not change what we
    report. Bytes are described, not copied."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return other(sc.PART_BLOB)
    dump = getattr(value, "model_dump", None)
    return plain(dump()) if callable(dump) else str(value)


def to_json(value: object) -> str:
    """JSON every parser reads: a model's tool arguments may hold NaN or Infinity, which JSON has no words for,
    so those are written as strings. Text as it is (not \\u-escaped: half the size or less outside ASCII), but a
    lone surrogate (a ``"\\ud800"`` a server wrote in its JSON) as U+FFFD: UTF-8 has no such character, and a string
    holding one fails the OTLP export of everything in its batch. A pair of them is the character they stand for
    (an emoji a server escaped as ``"\\ud83d\\ude00"``, perhaps split across two chunks)."""
    try:
        text = json.dumps(value, default=str, allow_nan=False, ensure_ascii=False)
    except ValueError:
        text = json.dumps(_finite(value), default=str, ensure_ascii=False)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            paired = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
            text = _SURROGATE.sub("\ufffd", paired)
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _with_mime(part: Part, mime_type: object) -> Part:
    if isinstance(mime_type, str) and mime_type:
        part["mime_type"] = mime_type
    return part


# --- output, gathered as it arrives ------------------------------------------------------------------------------


# fragments joined into one piece at a time: a stream's deltas are a few characters each, and one string object per
# delta held ~15 times the text (a 50,000-chunk answer)
_PIECE = 256


# the kinds of part whose text is gathered: a part of one of them with no text is left out
_TEXT_KINDS = frozenset({sc.PART_TEXT, sc.PART_REASONING, sc.PART_REFUSAL})


class _Gathered:
    """One part of an answer under way: text (output, reasoning or a refusal), a tool call whose arguments may come
    in fragments, or a part of another kind (a call of a tool the service runs), named by its type."""

    __slots__ = ("arguments", "call_id", "fragments", "kind", "name", "pieces")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.fragments: list[str] = []
        self.pieces = 0  # the fragments at the front already joined, a piece each
        self.call_id: str | None = None
        self.name: str | None = None
        self.arguments: object = None  # given whole (a non-streamed call): used when no fragments came

    def add(self, fragment: str) -> None:
        fragments = self.fragments
        fragments.append(fragment)
        if len(fragments) - self.pieces >= _PIECE:
            fragments[self.pieces:] = ["".join(fragments[self.pieces:])]
            self.pieces += 1

    def copy(self) -> _Gathered:
        found = _Gathered(self.kind)
        found.fragments, found.pieces = list(self.fragments), self.pieces
        found.call_id, found.name, found.arguments = self.call_id, self.name, self.arguments
        return found

    def part(self) -> Part:
        if self.kind == sc.PART_TOOL_CALL:
            return tool_call(self.call_id, self.name,
                             arguments("".join(self.fragments)) if self.fragments else self.arguments)
        if self.kind not in _TEXT_KINDS:
            return other(self.kind)
        return {"type": self.kind, "content": "".join(self.fragments)}


class Choice:
    """One choice of an answer: its parts in the order they began, keyed as the provider numbers them (a content
    block's index, a tool call's index); fragments are joined once, when the operation is written."""

    __slots__ = ("finish_reason", "parts")

    def __init__(self) -> None:
        self.parts: dict[Hashable, _Gathered] = {}
        self.finish_reason: str | None = None

    def text(self, fragment: str, key: Hashable = 0, kind: str = sc.PART_TEXT) -> None:
        """Text of the answer, or of another ``kind`` told the same way: reasoning, a refusal."""
        found = self.parts.get((kind, key))
        if found is None:
            found = self.parts[(kind, key)] = _Gathered(kind)
        found.add(fragment)

    def tool_call(self, key: Hashable, call_id: object = None, name: object = None, fragment: object = None,
                  whole: object = None) -> None:
        """A tool call, or what a chunk adds to it: its id and name, a fragment of its arguments' JSON, or its
        arguments ``whole``."""
        found = self.parts.get((sc.PART_TOOL_CALL, key))
        if found is None:
            found = self.parts[(sc.PART_TOOL_CALL, key)] = _Gathered(sc.PART_TOOL_CALL)
        if isinstance(call_id, str) and call_id:
            found.call_id = call_id
        if isinstance(name, str) and name:
            found.name = name
        if isinstance(fragment, str) and fragment:
            found.add(fragment)
        if whole is not None:
            found.arguments = whole

    def tool_call_fragment(self, key: Hashable, fragment: object) -> None:
        """A fragment of the arguments of a tool call begun before (input of another kind: not one)."""
        found = self.parts.get((sc.PART_TOOL_CALL, key))
        if found is not None and isinstance(fragment, str) and fragment:
            found.add(fragment)

    def other(self, key: Hashable, kind: object) -> None:
        """A part of a kind the conventions do not define (a call of a tool the service runs): named by its type."""
        name = other(kind)["type"]  # the name it has in the input too
        if (name, key) not in self.parts:
            self.parts[(name, key)] = _Gathered(name)

    def finish(self, reason: object) -> None:
        if isinstance(reason, str) and reason:
            self.finish_reason = reason


class Output:
    """What the model answered, per choice, gathered from a whole response or chunk by chunk (O(1) per chunk)."""

    __slots__ = ("_choices",)

    def __init__(self) -> None:
        self._choices: dict[int, Choice] = {}

    def choice(self, index: object = 0) -> Choice:
        key = index if isinstance(index, int) else 0
        found = self._choices.get(key)
        if found is None:
            found = self._choices[key] = Choice()
        return found

    def copy(self) -> Output:
        found = Output()
        for index, choice in self._choices.items():
            copy = found.choice(index)
            copy.finish_reason = choice.finish_reason
            copy.parts = {key: part.copy() for key, part in choice.parts.items()}
        return found

    def messages(self, finish_reasons: list[str], failed: bool) -> list[Message]:
        """One assistant message per choice. A choice's finish reason is its own, else the operation's when it had
        one choice, else ``error`` when the operation failed; left out when unknown."""
        choices = self._choices or ({0: Choice()} if finish_reasons else {})
        found = []
        for _, choice in sorted(choices.items()):
            parts = [part.part() for part in choice.parts.values()
                     if part.kind not in _TEXT_KINDS or any(part.fragments)]
            reason = choice.finish_reason
            if reason is None and len(choices) == 1 and finish_reasons:
                reason = finish_reasons[-1]
            entry = message(sc.ROLE_ASSISTANT, parts)
            if reason is not None or failed:
                entry["finish_reason"] = reason or sc.FINISH_ERROR
            found.append(entry)
        return found
