"""Pieces the server's ASGI middleware share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Send = Callable[[dict[str, Any]], Awaitable[None]]


class HttpMiddleware:
    """Middleware that looks at HTTP requests only (lifespan and other scopes pass through):
    subclasses write :meth:`http`."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        return await self.http(scope, receive, send)

    async def http(self, scope, receive, send):  # type: ignore[no-untyped-def]
        return await self.app(scope, receive, send)


async def refuse(send: Send, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> None:
    """Answer ``status`` with a JSON ``body`` and close the connection (the request's body, if
    any, is not read)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(b"connection", b"close"), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
