"""The one exception hierarchy of lmiserve.

Each error has a ``kind`` (what went wrong, independent of protocol) and a default HTTP
status. Routes map them to each protocol's error body in one place
(:mod:`lmiserve.server.errors`); nothing else decides status codes.

A subclass names its kind, status and title in its ``class`` line::

    class NotFound(LmiServeError, kind="not_found", status=404, title="Not Found"): ...
"""

from __future__ import annotations

from typing import Any


class LmiServeError(Exception):
    kind = "internal"
    status = 500
    title = "Internal Server Error"

    def __init_subclass__(cls, kind: str = "", status: int = 0, title: str = "", **rest: Any) -> None:
        super().__init_subclass__(**rest)
        cls.kind = kind or cls.kind
        cls.status = status or cls.status
        cls.title = title or cls.title

    def __init__(self, detail: str = "", *, status: int | None = None, headers: dict[str, str] | None = None):
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        if status is not None:
            self.status = status
        self.headers = headers or {}


class BadRequest(LmiServeError, kind="bad_request", status=400, title="Bad Request"):
    """The request cannot be understood (not JSON, wrong shape)."""


class ValidationFailed(LmiServeError, kind="validation", status=424, title="Validation Failed"):
    """The request is well formed but a value is out of range or not allowed."""


class InvalidParameter(ValidationFailed):
    """A well-formed request with a generation parameter out of its range (``top_p: 2``), as
    opposed to a body that does not fit the schema (a missing field, a wrong type)."""


class NotFound(LmiServeError, kind="not_found", status=404, title="Not Found"):
    """No such model, route or resource."""


class Unauthorized(LmiServeError, kind="unauthorized", status=401, title="Unauthorized"):
    """No valid API key came with the request."""

    def __init__(self, detail: str = "a valid API key is required"):
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(LmiServeError, kind="forbidden", status=403, title="Forbidden"):
    """The request is understood but not allowed (a management call from afar, a path outside the roots)."""


class Conflict(LmiServeError, kind="conflict", status=409, title="Conflict"):
    """The request clashes with the server's state (a model registered twice)."""


class PayloadTooLarge(LmiServeError, kind="payload_too_large", status=413, title="Payload Too Large"):
    """The body is larger than ``max_request_size``."""


class Overloaded(LmiServeError, kind="overloaded", status=503, title="Service Unavailable"):
    """The job queue is full, the request would wait past its deadline, or its first token past
    option.max_first_token_wait; the client should retry later."""

    def __init__(self, detail: str = "", *, retry_after: int = 1, reason: str = "queue_full"):
        super().__init__(detail, headers={"Retry-After": str(retry_after)})
        self.reason = reason
        """Why it was refused (the refusals metric's label)."""


class ModelNotReady(LmiServeError, kind="not_ready", status=503, title="Service Unavailable"):
    """The model is still loading, or is being restarted."""


class HandlerFailure(LmiServeError, kind="handler", status=424, title="invoke handler failure"):
    """The model's handler raised or returned something unusable."""


class PredictTimeout(LmiServeError, kind="timeout", status=504, title="Gateway Timeout"):
    """The request did not finish within its deadline."""


class WorkerDied(LmiServeError, kind="worker_died", status=503, title="Service Unavailable"):
    """The worker process handling the request exited before answering."""


class GenerationError(LmiServeError, kind="generation", status=500, title="Generation Failed"):
    """Generation failed for one request after it started."""


class RequestPoisoned(GenerationError, status=424, title="Failed Dependency"):
    """The request was starting in the engine both times it crashed, twice running: it is taken
    for the cause and not run again."""


class InsufficientMemory(LmiServeError, kind="insufficient_memory", status=507, title="Insufficient Storage"):
    """A model does not fit in the memory left for models (SageMaker's multi-model contract: 507)."""


class ModelLoadFailed(LmiServeError, kind="model_load_failed", status=424, title="Failed Dependency"):
    """The model a request depends on exists but could not be loaded."""
