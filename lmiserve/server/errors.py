"""Errors to HTTP responses, in one place.

The LMI/DJL error body is ``{"code": <status>, "message": <title>, "error": <detail>}``.
"""

from __future__ import annotations

import json
import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from ..errors import BadRequest, LmiServeError
from ..formatters import errors as protocol_errors

log = logging.getLogger("lmiserve.server")


def lmi_error_body(err: LmiServeError) -> dict[str, object]:
    return {"code": err.status, "message": err.title, "error": err.detail}


def error_response(err: LmiServeError, protocol: str = "lmi") -> JSONResponse:
    """The error in the body shape of ``protocol`` (see lmiserve.formatters.errors)."""
    status, body = protocol_errors.PROTOCOLS[protocol](err)
    return JSONResponse(body, status_code=status, headers=err.headers)


def protocol_of(request: Request) -> str:
    return getattr(request.state, "protocol", "lmi")


def stream_error_chunk(err: LmiServeError, content_type: str) -> bytes:
    """The last chunk of a stream that failed after its first byte was sent."""
    line = json.dumps(lmi_error_body(err))
    if content_type.startswith("text/event-stream"):
        return f"data: {line}\n\n".encode()
    return (line + "\n").encode()


async def _lmiserve_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LmiServeError)
    return error_response(exc, protocol_of(request))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    body = {
        "code": exc.status_code,
        "message": str(exc.detail),
        "error": f"{request.method} {request.url.path}: {exc.detail}",
    }
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    detail = f"{where}: {first.get('msg', 'invalid request')}" if where else str(first.get("msg", "invalid request"))
    return error_response(BadRequest(detail), protocol_of(request))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    body = {"code": 500, "message": "Internal Server Error", "error": f"{type(exc).__name__}: {exc}"}
    return JSONResponse(body, status_code=500)


def install(app) -> None:  # type: ignore[no-untyped-def]
    app.add_exception_handler(LmiServeError, _lmiserve_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
