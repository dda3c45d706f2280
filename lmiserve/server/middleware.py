"""ASGI middleware: request ids, the request size limit and request metrics.

Written against raw ASGI so that streaming responses pass through untouched.
"""

from __future__ import annotations

import json
import time
import uuid

from ..errors import PayloadTooLarge
from .asgi import HttpMiddleware, refuse
from .metrics import ServerMetrics

REQUEST_ID_HEADERS = (b"x-amzn-sagemaker-inference-id", b"x-request-id")


class RequestIdMiddleware(HttpMiddleware):
    """Every response carries ``x-request-id``: the caller's SageMaker inference id or
    X-Request-Id when sent, else a new one. Routes find it in ``scope["state"]``."""

    async def http(self, scope, receive, send):  # type: ignore[no-untyped-def]
        headers = dict(scope.get("headers") or [])
        request_id = None
        for name in REQUEST_ID_HEADERS:
            value = headers.get(name)
            if value:
                request_id = value.decode("latin-1")[:256]
                break
        request_id = request_id or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        encoded = request_id.encode("latin-1")

        async def send_with_id(message):  # type: ignore[no-untyped-def]
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", encoded)]
            await send(message)

        await self.app(scope, receive, send_with_id)


class BodyLimitMiddleware(HttpMiddleware):
    """Refuse bodies over ``limit`` bytes with 413: at once when Content-Length says so,
    else as soon as the streamed body passes the limit."""

    def __init__(self, app, limit: int):  # type: ignore[no-untyped-def]
        super().__init__(app)
        self.limit = limit

    async def http(self, scope, receive, send):  # type: ignore[no-untyped-def]
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(send, int(length))
            return
        seen = 0

        async def limited_receive():  # type: ignore[no-untyped-def]
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise PayloadTooLarge(self._detail(seen, at_least=True))
            return message

        await self.app(scope, limited_receive, send)

    def _detail(self, size: int, at_least: bool = False) -> str:
        qualifier = "at least " if at_least else ""
        return f"request body of {qualifier}{size} bytes exceeds max_request_size ({self.limit} bytes)"

    async def _refuse(self, send, size: int) -> None:  # type: ignore[no-untyped-def]
        body = json.dumps({"code": 413, "message": "Payload Too Large", "error": self._detail(size)}).encode()
        await refuse(send, 413, body)


class MetricsMiddleware(HttpMiddleware):
    """Counts and times every HTTP request (see :meth:`ServerMetrics.request_done`). The status
    is the one the response started with: 500 when the app raised before answering, 499 when
    the request ended without an answer. A streamed response is timed to its last byte."""

    def __init__(self, app, metrics: ServerMetrics):  # type: ignore[no-untyped-def]
        super().__init__(app)
        self.metrics = metrics

    async def http(self, scope, receive, send):  # type: ignore[no-untyped-def]
        scope.setdefault("state", {})
        started = time.perf_counter()
        status: int | None = None

        async def send_with_status(message):  # type: ignore[no-untyped-def]
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        except Exception:
            status = status or 500
            raise
        finally:
            self.metrics.request_done(scope, status or 499, time.perf_counter() - started)
