"""The one exception hierarchy of lmiserve.

Each error has a ``kind`` (what went wrong, independent of protocol) and a default HTTP
status. Routes map them to each protocol's error body in one place
(:mod:`lmiserve.server.errors`); nothing else decides status codes.
"""

from __future__ import annotations


class LmiServeError(Exception):
    kind = "internal"
    status = 500
    title = "Internal Server Error"

    def __init__(self, detail: str = "", *, status: int | None = None, headers: dict[str, str] | None = None):
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        if status is not None:
            self.status = status
        self.headers = headers or {}


class BadRequest(LmiServeError):
    """The request cannot be understood (not JSON, wrong shape)."""

    kind = "bad_request"
    status = 400
    title = "Bad Request"


class ValidationFailed(LmiServeError):
    """The request is well formed but a value is out of range or not allowed."""

    kind = "validation"
    status = 424
    title = "Validation Failed"


class InvalidParameter(ValidationFailed):
    """A well-formed request with a generation parameter out of its range (``top_p: 2``), as
    opposed to a body that does not fit the schema (a missing field, a wrong type)."""


class NotFound(LmiServeError):
    kind = "not_found"
    status = 404
    title = "Not Found"


class Unauthorized(LmiServeError):
    """No valid API key came with the request."""

    kind = "unauthorized"
    status = 401
    title = "Unauthorized"

    def __init__(self, detail: str = "a valid API key is required"):
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(LmiServeError):
    """The request is understood but not allowed (a management call from afar, a path outside the roots)."""

    kind = "forbidden"
    status = 403
    title = "Forbidden"


class Conflict(LmiServeError):
    """The request clashes with the server's state (a model registered twice)."""

    kind = "conflict"
    status = 409
    title = "Conflict"


class PayloadTooLarge(LmiServeError):
    kind = "payload_too_large"
    status = 413
    title = "Payload Too Large"


class Overloaded(LmiServeError):
    """The job queue is full; the client should retry later."""

    kind = "overloaded"
    status = 503
    title = "Service Unavailable"

    def __init__(self, detail: str = "", *, retry_after: int = 1):
        super().__init__(detail, headers={"Retry-After": str(retry_after)})


class ModelNotReady(LmiServeError):
    kind = "not_ready"
    status = 503
    title = "Service Unavailable"


class HandlerFailure(LmiServeError):
    """The model's handler raised or returned something unusable."""

    kind = "handler"
    status = 424
    title = "invoke handler failure"


class PredictTimeout(LmiServeError):
    kind = "timeout"
    status = 504
    title = "Gateway Timeout"


class WorkerDied(LmiServeError):
    """The worker process handling the request exited before answering."""

    kind = "worker_died"
    status = 503
    title = "Service Unavailable"


class GenerationError(LmiServeError):
    """Generation failed for one request after it started."""

    kind = "generation"
    status = 500
    title = "Generation Failed"


class InsufficientMemory(LmiServeError):
    """A model does not fit in the memory left for models (SageMaker's multi-model contract: 507)."""

    kind = "insufficient_memory"
    status = 507
    title = "Insufficient Storage"


class ModelLoadFailed(LmiServeError):
    """The model a request depends on exists but could not be loaded."""

    kind = "model_load_failed"
    status = 424
    title = "Failed Dependency"
