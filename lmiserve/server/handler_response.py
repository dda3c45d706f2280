"""Answering an HTTP request with a handler model: the body goes to a worker as it is, and the
handler's output comes back as the response (streamed when the handler streams)."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from .. import wire
from ..serving import HandlerModel, Reply
from .bodies import read_body, request_properties
from .http_reply import http_response


async def handler_reply(model: HandlerModel, request: Request, body: bytes | None = None) -> Reply:
    """The handler's answer to ``request`` (its ``body``, where it was read already), through
    the app's :class:`~lmiserve.server.data_plane.DataPlane`."""
    if body is None:
        body = await read_body(request)
    item = wire.JobItem(request_id=request.state.request_id, properties=request_properties(request), body=body)
    return await request.app.state.plane.answer_handler(model, item)


async def invoke_handler(model: HandlerModel, request: Request, body: bytes | None = None) -> Response:
    return http_response(await handler_reply(model, request, body))
