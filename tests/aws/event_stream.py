"""AWS event-stream messages, encoded by hand from the format's definition.

A message is: a 12-byte prelude (total length, headers length, both big-endian uint32, then the
CRC32 of those 8 bytes), the headers (name length uint8, name, value type uint8 -- 7 is a string --,
value length uint16, value), the payload, and the CRC32 of everything before it.
"""

from __future__ import annotations

import json
import random
import struct
import zlib

_STRING = 7


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    encoded_headers = b"".join(_header(name, value) for name, value in headers.items())
    total = 12 + len(encoded_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded_headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded_headers + payload
    return message + struct.pack(">I", zlib.crc32(message))


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return bytes([len(raw_name)]) + raw_name + bytes([_STRING]) + struct.pack(">H", len(raw_value)) + raw_value


def payload_part(data: bytes) -> bytes:
    headers = {":event-type": "PayloadPart", ":content-type": "application/octet-stream", ":message-type": "event"}
    return encode_message(headers, data)


def exception_event(kind: str, body: dict) -> bytes:
    headers = {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"}
    return encode_message(headers, json.dumps(body).encode())


def split_randomly(data: bytes, rng: random.Random, most: int = 17) -> list[bytes]:
    """``data`` cut at random points into pieces of 1..most bytes."""
    pieces, at = [], 0
    while at < len(data):
        size = rng.randint(1, most)
        pieces.append(data[at : at + size])
        at += size
    return pieces


def stream_body(payload: bytes, rng: random.Random, most_per_part: int = 9, error: bytes | None = None) -> bytes:
    """``payload`` as PayloadPart events of random sizes (cutting lines and characters anywhere), then ``error``."""
    events = b"".join(payload_part(part) for part in split_randomly(payload, rng, most_per_part))
    return events + (error or b"")
