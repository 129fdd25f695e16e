"""Anthropic's Messages shapes as message content of the conventions (see _content): the anthropic client's
arguments, messages and stream events, and Claude's JSON bodies on Bedrock; and what a stream's blocks tell of the
operation's timing (a server tool's wait, thinking the stream hides). Blocks may be the client's objects or plain
dicts. Imports no SDK."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from otel_llm import _content as ct
from otel_llm import _semconv as sc
from otel_llm._content import Message, Output, Part
from otel_llm.providers._values import field

if TYPE_CHECKING:
    from otel_llm._operation import Operation

_MODALITIES = {"image": sc.MODALITY_IMAGE, "document": sc.MODALITY_DOCUMENT}


def part(block: Any) -> Part:
    """One content block: text, image, document, tool_use, tool_result, thinking; any other by its type."""
    kind = field(block, "type")
    if kind == "text":
        return ct.text(field(block, "text"))
    if kind == "tool_use":
        return ct.tool_call(field(block, "id"), field(block, "name"), ct.plain(field(block, "input")))
    if kind == "tool_result":
        content = field(block, "content")
        response = content if isinstance(content, str) else [part(item) for item in ct.listed(content)]
        return ct.tool_call_response(field(block, "tool_use_id"), response)
    if kind == "thinking":
        return ct.reasoning(field(block, "thinking"))
    modality = _MODALITIES.get(kind) if isinstance(kind, str) else None
    if modality is not None:
        source = field(block, "source")
        source_type, media_type = field(source, "type"), field(source, "media_type")
        if source_type == "url":
            return ct.linked(modality, field(source, "url"), media_type)
        if source_type == "file" and isinstance(field(source, "file_id"), str):
            return ct.file(modality, field(source, "file_id"), media_type)
        if source_type in ("base64", "text"):
            return ct.blob(modality, media_type)
    return ct.other(kind)  # redacted thinking, server tools' blocks, ...: named, not copied


def parts(content: Any) -> list[Part]:
    if isinstance(content, str):
        return [ct.text(content)]
    return [part(block) for block in content] if isinstance(content, (list, tuple)) else []


def messages(given: Any) -> list[Message]:
    """The conversation: tool results stay in the user's messages, as the API has them."""
    if not isinstance(given, (list, tuple)):
        return []
    return [ct.message(field(message, "role"), parts(field(message, "content"))) for message in given]


def system_instructions(system: Any) -> list[Part] | None:
    """``system``: a string or text blocks."""
    found = parts(system)
    return found or None


def read_content(output: Output, content: Any) -> None:
    """A whole message's content: text and tool calls, keyed by block."""
    found = output.choice()
    for key, block in enumerate(content or ()):
        kind = field(block, "type")
        if kind == "text":
            found.text(field(block, "text") or "", key)
        elif kind == "thinking":
            found.text(field(block, "thinking") or "", key, sc.PART_REASONING)
        elif kind == "tool_use":
            found.tool_call(key, field(block, "id"), field(block, "name"), whole=ct.plain(field(block, "input")))


def gather_event(output: Output, event: Any) -> None:
    """One stream event: a tool call begins with its id and name, text and its arguments' JSON come in deltas."""
    kind = field(event, "type")
    if kind == "content_block_delta":
        delta = field(event, "delta")
        delta_type = field(delta, "type")
        if delta_type == "text_delta":
            output.choice().text(field(delta, "text") or "", field(event, "index"))
        elif delta_type == "thinking_delta":
            output.choice().text(field(delta, "thinking") or "", field(event, "index"), sc.PART_REASONING)
        elif delta_type == "input_json_delta":  # a server tool's input too, which is no tool call of the caller's
            output.choice().tool_call_fragment(field(event, "index"), field(delta, "partial_json"))
    elif kind == "content_block_start":
        block = field(event, "content_block")
        if field(block, "type") == "tool_use":
            output.choice().tool_call(field(event, "index"), field(block, "id"), field(block, "name"),
                                      whole=ct.plain(field(block, "input")))


def block_started(op: Operation, block_type: object) -> None:
    """A block of a streamed answer starts. One holding what a tool the service ran itself found
    (web_search_tool_result, code_execution_tool_result, mcp_tool_result, ...): the model waited on it, decoding
    nothing (results of the caller's own tools come in requests, never in an answer). A redacted thinking block:
    reasoning the stream hides, its tokens in the output count."""
    if block_type == "redacted_thinking":
        op.reasoning_hidden = True
    elif isinstance(block_type, str) and block_type.endswith("_tool_result"):
        op.waiting_on_a_tool()


def signature_arrived(op: Operation) -> None:
    """A thinking block's signature: with no thinking text streamed before it, the thinking was omitted."""
    if not op.reasoning_streamed:
        op.reasoning_hidden = True
