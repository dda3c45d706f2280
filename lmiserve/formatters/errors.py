"""Each protocol's error body for an :class:`~lmiserve.errors.LmiServeError`, in one place.

Functions return ``(status, body)``; routes and the app's exception handler pick the one of
the protocol the request came in with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import GenerationError, LmiServeError
from . import json_wire
from .responder import Responder

ErrorBody = tuple[int, dict[str, Any]]


def lmi(err: LmiServeError) -> ErrorBody:
    """DJL / LMI: ``{"code", "message", "error"}``."""
    return err.status, {"code": err.status, "message": err.title, "error": err.detail}


# How each error kind reads in each protocol: TGI's error_type and status, OpenAI's error type
# and status, Databricks' error_code, Amazon Bedrock's exception and status. None: the
# protocol's catch-all (TGI "generation", OpenAI "server_error", Databricks INTERNAL_ERROR),
# with the error's own status.
# fmt: off
_KINDS: dict[str, tuple[tuple[str, int], tuple[str, int] | None, str | None, tuple[str, int]]] = {
    "validation":        (("validation", 422),   ("invalid_request_error", 400), "INVALID_PARAMETER_VALUE", ("ValidationException", 400)),
    "bad_request":       (("validation", 422),   ("invalid_request_error", 400), "BAD_REQUEST",             ("ValidationException", 400)),
    "payload_too_large": (("validation", 413),   ("invalid_request_error", 413), "BAD_REQUEST",             ("ValidationException", 413)),
    "overloaded":        (("overloaded", 429),   ("server_overloaded", 503),     "REQUEST_LIMIT_EXCEEDED",  ("ThrottlingException", 429)),
    "not_ready":         (("unhealthy", 503),    ("server_error", 503),          "TEMPORARILY_UNAVAILABLE", ("ServiceUnavailableException", 503)),
    "worker_died":       (("generation", 503),   ("server_error", 503),          "TEMPORARILY_UNAVAILABLE", ("ServiceUnavailableException", 503)),
    "timeout":           (("generation", 504),   ("timeout", 504),               "DEADLINE_EXCEEDED",       ("ModelTimeoutException", 408)),
    "not_found":         (("not_found", 404),    ("not_found_error", 404),       "RESOURCE_DOES_NOT_EXIST", ("ResourceNotFoundException", 404)),
    "conflict":          (("validation", 409),   ("invalid_request_error", 409), "RESOURCE_ALREADY_EXISTS", ("ConflictException", 409)),
    "generation":        (("generation", 424),   None,                           None,                      ("ModelErrorException", 424)),
    "unauthorized":      (("unauthorized", 401), ("invalid_request_error", 401), "UNAUTHENTICATED",         ("AccessDeniedException", 401)),
    "forbidden":         (("forbidden", 403),    ("permission_error", 403),      "PERMISSION_DENIED",       ("AccessDeniedException", 403)),
}
# fmt: on
_TGI, _OPENAI, _DATABRICKS, _BEDROCK = range(4)


def _column(err: LmiServeError, column: int) -> Any:
    row = _KINDS.get(err.kind)
    return row[column] if row else None


def tgi(err: LmiServeError) -> ErrorBody:
    """TGI / MindIE: ``{"error", "error_type"}``; validation failures are 422, overload 429."""
    kind, status = _column(err, _TGI) or ("generation", err.status)
    return status, {"error": err.detail, "error_type": kind}


def openai(err: LmiServeError, param: str | None = None) -> ErrorBody:
    """OpenAI: ``{"error": {"message", "type", "param", "code"}}``."""
    kind, status = _column(err, _OPENAI) or ("server_error", err.status)
    param = param or getattr(err, "param", None)
    return status, {"error": {"message": err.detail, "type": kind, "param": param, "code": status}}


def databricks(err: LmiServeError) -> ErrorBody:
    """Databricks REST: ``{"error_code", "message"}``."""
    status = 400 if err.kind in ("validation", "bad_request") else 429 if err.kind == "overloaded" else err.status
    return status, {"error_code": _column(err, _DATABRICKS) or "INTERNAL_ERROR", "message": err.detail}


def kserve(err: LmiServeError) -> ErrorBody:
    """Open Inference Protocol: ``{"error": "..."}``."""
    status = 400 if err.kind in ("validation", "bad_request") else err.status
    return status, {"error": err.detail}


def bedrock_type(err: LmiServeError) -> tuple[str, int]:
    """Amazon Bedrock's exception name and status for an error."""
    return _column(err, _BEDROCK) or ("InternalServerException", err.status if err.status >= 500 else 500)


def bedrock(err: LmiServeError) -> ErrorBody:
    """Amazon Bedrock: ``{"message"}``; the exception's name goes in the ``x-amzn-ErrorType`` header."""
    _, status = bedrock_type(err)
    return status, {"message": err.detail}


PROTOCOLS = {
    "lmi": lmi,
    "tgi": tgi,
    "openai": openai,
    "databricks": databricks,
    "kserve": kserve,
    "bedrock": bedrock,
}


class ErrorsIn(Responder):
    """A responder's ``error_chunk`` and ``error_body`` in its protocol's error shape.

    A subclass names the protocol's mapping (``error_shape = staticmethod(errors.tgi)``) and
    how its stream frames an event (``event_prefix``: ``b"data: "`` or TGI's ``b"data:"``)."""

    error_shape: Callable[[LmiServeError], ErrorBody]
    event_prefix: bytes = b"data: "

    def error_chunk(self, message: str) -> bytes:
        """A failure after the stream began, as the stream's last event."""
        _, body = self.error_shape(GenerationError(message))
        return self.event_prefix + json_wire.dumps(body) + b"\n\n"

    def error_body(self, err: LmiServeError) -> tuple[int, bytes]:
        """A failure before the first byte: the status and the protocol's error body."""
        status, body = self.error_shape(err)
        return status, json_wire.dumps(body)
