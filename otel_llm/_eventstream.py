"""The AWS event-stream binary framing that Bedrock's streaming responses use, encoding side only.

A message is a prelude (total length, headers length, CRC32 of those 8 bytes), the headers, the payload and a CRC32
of everything before it; integers are big-endian. Only string headers (value type 7) are written: they are all that
Bedrock's events carry. botocore does the decoding.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping

_STRING = 7  # header value type: UTF-8 string with a 2-byte length


def message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message with string `headers`, in the order given."""
    encoded = b"".join(_header(name, value) for name, value in headers.items())
    prelude = struct.pack(">II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    framed = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return framed + struct.pack(">I", zlib.crc32(framed))


def event(event_type: str, payload: bytes) -> bytes:
    """An `event` message of `event_type` whose payload is JSON, as Bedrock sends them."""
    return message({":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}, payload)


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return struct.pack(">B", len(raw_name)) + raw_name + struct.pack(">BH", _STRING, len(raw_value)) + raw_value
