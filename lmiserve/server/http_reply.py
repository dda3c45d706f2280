"""Generation answers over HTTP: the request's deadline header, its disconnect, and the
:class:`~lmiserve.serving.Reply` as a response."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response, StreamingResponse

from ..errors import LmiServeError
from ..generation.request import GenerationRequest
from ..serving import Reply, Responder, TextModel, error_reply, respond
from . import deadline
from .metrics import observe_generation
from .tenant import tenant_of


async def wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def http_response(reply: Reply) -> Response:
    if reply.chunks is not None:
        return StreamingResponse(
            reply.chunks, status_code=reply.status, media_type=reply.media_type, headers=reply.headers
        )
    return Response(reply.body, status_code=reply.status, media_type=reply.media_type, headers=reply.headers)


async def respond_over_http(
    model: TextModel, requests: list[GenerationRequest], responder: Responder, request: Request
) -> Response:
    """Run ``requests`` and answer with ``responder``'s protocol, within the request's deadline."""
    try:
        seconds = deadline.budget(request, float(model.settings.model.predict_timeout))
    except LmiServeError as err:
        return http_response(error_reply(responder, err))
    observer = observe_generation(request, model.name)
    tenant = tenant_of(request, model.settings)
    reply = await respond(model, requests, responder, seconds, observer, lambda: wait_for_disconnect(request), tenant)
    return http_response(reply)
