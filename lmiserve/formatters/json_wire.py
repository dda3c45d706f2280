"""JSON bytes for response bodies and stream events.

orjson writes every character as UTF-8. Three of them are line breaks to common line readers though
not to SSE or JSON Lines: U+0085, U+2028 and U+2029 (Python's ``str.splitlines``, which httpx's
``iter_lines`` follows, and JavaScript's older ``JSON`` handling). A generated token that decodes to one
of them would cut an event in two for such a client. Inside JSON they can only stand in strings, so they
are written as ``\\uXXXX`` escapes: the same text for every JSON reader, one line for every line reader.
"""

from __future__ import annotations

from typing import Any

import orjson

_LINE_BREAKS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def dumps(obj: Any) -> bytes:
    """``orjson.dumps(obj)`` with U+0085, U+2028 and U+2029 escaped."""
    return one_line(orjson.dumps(obj))


def one_line(out: bytes) -> bytes:
    """JSON bytes (UTF-8) with U+0085, U+2028 and U+2029 escaped, from any JSON encoder."""
    if out.isascii():  # the common case, checked at memory speed
        return out
    for raw, escaped in _LINE_BREAKS:
        if raw in out:
            out = out.replace(raw, escaped)
    return out
