"""Answering through a model's custom output formatter.

The formatter is called with a :class:`~lmiserve.formatters.request_io.TextGenerationOutput` at
every update and what it returns is sent: each non-empty piece as it comes when streaming (the
status waits for the first one), all of them joined into one body otherwise. A formatter that
raises ends that request with LMI's 424 error payload ``{"error": ..., "code": 424}`` (as the
status before the first byte, as the last line after it); other requests are not affected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from ...errors import GenerationError, LmiServeError, ValidationFailed
from ...formatters.lmi_rolling import JSON
from ...formatters.request_io import TextInput, generation_output
from ...formatters.responder import Responder
from ...generation.request import RequestOutput

log = logging.getLogger("lmiserve.formatters")

JSONLINES = "application/jsonlines"


class FormatterFailed(GenerationError):
    """A custom output formatter raised or returned something that cannot be sent."""

    status = 424


def error_payload(message: str, code: int = 424) -> bytes:
    return orjson.dumps({"error": message, "code": code})


def _as_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict | list):
        return orjson.dumps(value)
    raise TypeError(f"returned {type(value).__name__}; return str or bytes")


class CustomResponder(Responder):
    """A :class:`~lmiserve.serving.Responder` whose every piece is the output formatter's."""

    hold_headers = True

    def __init__(self, fn: Callable[..., Any], request: TextInput, content_type: str | None):
        self.fn = fn
        self.request = request
        self.name = getattr(fn, "__name__", "output_formatter")
        self.stream = bool(request.stream)
        self.media_type = content_type or (JSONLINES if self.stream else JSON)
        self.body_media_type = self.media_type
        self._parts: list[bytes] = []

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        self.request.request_id = out.request_id
        try:
            return _as_bytes(self.fn(generation_output(out, self.request)))
        except Exception as exc:  # noqa: BLE001 - the user's formatter; its request ends, the server goes on
            log.exception("output formatter %s failed on request %s", self.name, out.request_id)
            raise FormatterFailed(f"output formatter {self.name} failed: {type(exc).__name__}: {exc}") from None

    def collect(self, index: int, out: RequestOutput) -> None:
        if out.error is None:
            self._parts.append(self.chunk(index, out))

    def body(self, outs: list[RequestOutput]) -> bytes:
        return b"".join(self._parts)

    def error_chunk(self, message: str) -> bytes:
        return error_payload(message) + b"\n"

    def error_body(self, err: LmiServeError) -> tuple[int, bytes]:
        code = 424 if isinstance(err, ValidationFailed) else (err.status if err.status >= 400 else 500)
        return code, error_payload(err.detail, code)
