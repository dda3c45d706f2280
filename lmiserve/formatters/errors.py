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
}


def databricks(err: LmiServeError) -> ErrorBody:
    """Databricks REST: ``{"error_code", "message"}``."""
    status = 400 if err.kind in ("validation", "bad_request") else 429 if err.kind == "overloaded" else err.status
    return status, {"error_code": _DATABRICKS_CODES.get(err.kind, "INTERNAL_ERROR"), "message": err.detail}


def kserve(err: LmiServeError) -> ErrorBody:
    """Open Inference Protocol: ``{"error": "..."}``."""
    status = 400 if err.kind in ("validation", "bad_request") else err.status
    return status, {"error": err.detail}


PROTOCOLS = {"lmi": lmi, "tgi": tgi, "openai": openai, "databricks": databricks, "kserve": kserve}
