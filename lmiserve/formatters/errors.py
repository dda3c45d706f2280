"""Each protocol's error body for an :class:`~lmiserve.errors.LmiServeError`, in one place.

Functions return ``(status, body)``; routes and the app's exception handler pick the one of
the protocol the request came in with.
"""

from __future__ import annotations

from typing import Any

from ..errors import LmiServeError

ErrorBody = tuple[int, dict[str, Any]]


def lmi(err: LmiServeError) -> ErrorBody:
    """DJL / LMI: ``{"code", "message", "error"}``."""
    return err.status, {"code": err.status, "message": err.title, "error": err.detail}


_TGI_TYPES = {
    "validation": ("validation", 422),
    "bad_request": ("validation", 422),
    "payload_too_large": ("validation", 413),
    "overloaded": ("overloaded", 429),
    "not_ready": ("unhealthy", 503),
    "worker_died": ("generation", 503),
    "timeout": ("generation", 504),
    "not_found": ("not_found", 404),
    "conflict": ("validation", 409),
    "generation": ("generation", 424),
    "unauthorized": ("unauthorized", 401),
    "forbidden": ("forbidden", 403),
}


def tgi(err: LmiServeError) -> ErrorBody:
    """TGI / MindIE: ``{"error", "error_type"}``; validation failures are 422, overload 429."""
    kind, status = _TGI_TYPES.get(err.kind, ("generation", err.status))
    return status, {"error": err.detail, "error_type": kind}


_OPENAI_TYPES = {
    "validation": ("invalid_request_error", 400),
    "bad_request": ("invalid_request_error", 400),
    "payload_too_large": ("invalid_request_error", 413),
    "not_found": ("not_found_error", 404),
    "conflict": ("invalid_request_error", 409),
    "overloaded": ("server_overloaded", 503),
    "not_ready": ("server_error", 503),
    "worker_died": ("server_error", 503),
    "timeout": ("timeout", 504),
    "unauthorized": ("invalid_request_error", 401),
    "forbidden": ("permission_error", 403),
}


def openai(err: LmiServeError, param: str | None = None) -> ErrorBody:
    """OpenAI: ``{"error": {"message", "type", "param", "code"}}``."""
    kind, status = _OPENAI_TYPES.get(err.kind, ("server_error", err.status))
    param = param or getattr(err, "param", None)
    return status, {"error": {"message": err.detail, "type": kind, "param": param, "code": status}}


_DATABRICKS_CODES = {
    "validation": "INVALID_PARAMETER_VALUE",
    "bad_request": "BAD_REQUEST",
    "payload_too_large": "BAD_REQUEST",
    "not_found": "RESOURCE_DOES_NOT_EXIST",
    "conflict": "RESOURCE_ALREADY_EXISTS",
    "overloaded": "REQUEST_LIMIT_EXCEEDED",
    "not_ready": "TEMPORARILY_UNAVAILABLE",
    "worker_died": "TEMPORARILY_UNAVAILABLE",
    "timeout": "DEADLINE_EXCEEDED",
    "unauthorized": "UNAUTHENTICATED",
    "forbidden": "PERMISSION_DENIED",
}


def databricks(err: LmiServeError) -> ErrorBody:
    """Databricks REST: ``{"error_code", "message"}``."""
    status = 400 if err.kind in ("validation", "bad_request") else 429 if err.kind == "overloaded" else err.status
    return status, {"error_code": _DATABRICKS_CODES.get(err.kind, "INTERNAL_ERROR"), "message": err.detail}


def kserve(err: LmiServeError) -> ErrorBody:
    """Open Inference Protocol: ``{"error": "..."}``."""
    status = 400 if err.kind in ("validation", "bad_request") else err.status
    return status, {"error": err.detail}


BEDROCK_TYPES = {
    "validation": ("ValidationException", 400),
    "bad_request": ("ValidationException", 400),
    "payload_too_large": ("ValidationException", 413),
    "not_found": ("ResourceNotFoundException", 404),
    "conflict": ("ConflictException", 409),
    "overloaded": ("ThrottlingException", 429),
    "not_ready": ("ServiceUnavailableException", 503),
    "worker_died": ("ServiceUnavailableException", 503),
    "timeout": ("ModelTimeoutException", 408),
    "generation": ("ModelErrorException", 424),
    "unauthorized": ("AccessDeniedException", 401),
    "forbidden": ("AccessDeniedException", 403),
}


def bedrock_type(err: LmiServeError) -> tuple[str, int]:
    """Amazon Bedrock's exception name and status for an error."""
    return BEDROCK_TYPES.get(err.kind, ("InternalServerException", err.status if err.status >= 500 else 500))


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
