"""The events of ``InvokeEndpointWithResponseStream``, decoded from the raw HTTP body.

The body is an AWS event stream: binary messages (prelude, headers, payload, CRCs) that arrive split
across HTTP chunks at any byte. botocore's ``EventStreamBuffer`` frames and checks them; this module
gives them their SageMaker meaning: ``PayloadPart`` events carry the next bytes of the model's answer,
``ModelStreamError`` and ``InternalStreamFailure`` end the stream with an error. Keeping the raw
messages (rather than botocore's parsed events) preserves the ``ErrorCode`` of a ``ModelStreamError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass
class ResponseStreamError(Exception):
    """The stream ended with an error event (or broke off in the middle of a message)."""

    kind: str  # ModelStreamError, InternalStreamFailure, or another exception/error type
    message: str
    error_code: str | None = None

    def __str__(self) -> str:
        code = f" ({self.error_code})" if self.error_code else ""
        return f"{self.kind}{code}: {self.message}"


def payload_parts(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The bytes of each ``PayloadPart`` in the event stream whose raw body arrives as ``chunks``.

    Raises ``ResponseStreamError`` at an error event, or when the body ends inside a message.
    Events of other types are skipped, so newer event types do not break older clients.
    """
    from botocore.eventstream import EventStreamBuffer

    buffer = EventStreamBuffer()
    received = decoded = 0
    for chunk in chunks:
        if not chunk:
            continue
        received += len(chunk)
        buffer.add_data(chunk)
        for message in buffer:
            decoded += message.prelude.total_length
            payload = _payload(message.headers, message.payload)
            if payload is not None:
                yield payload
    if received != decoded:
        raise ResponseStreamError(
            "IncompleteStream", f"the response stream ended inside an event ({received - decoded} bytes left over)"
        )


def _payload(headers: dict, payload: bytes) -> bytes | None:
    message_type = headers.get(":message-type")
    if message_type == "event":
        return payload if headers.get(":event-type") == "PayloadPart" else None
    if message_type == "exception":
        kind = str(headers.get(":exception-type", "UnknownException"))
        body = _json_object(payload)
        message = body.get("Message", body.get("message", payload.decode("utf-8", errors="replace")))
        raise ResponseStreamError(kind, str(message), body.get("ErrorCode"))
    if message_type == "error":
        code = str(headers.get(":error-code", "UnknownError"))
        raise ResponseStreamError(code, str(headers.get(":error-message", "")))
    return None


def _json_object(payload: bytes) -> dict:
    try:
        value = json.loads(payload or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
