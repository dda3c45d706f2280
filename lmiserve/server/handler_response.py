"""Answering an HTTP request with a handler model: the body goes to a worker as it is, and the
handler's output comes back as the response (streamed when the handler streams)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from starlette.responses import Response, StreamingResponse

from .. import wire
from ..errors import LmiServeError
from ..serving import HandlerModel
from .bodies import read_body, request_properties
from .errors import stream_error_chunk


async def _stream_body(stream, content_type: str) -> AsyncIterator[bytes]:  # type: ignore[no-untyped-def]
    try:
        async for chunk in stream.chunks():
            yield chunk
    except LmiServeError as err:
        yield stream_error_chunk(err, content_type)


async def invoke_handler(model: HandlerModel, request: Request, body: bytes | None = None) -> Response:
    if body is None:
        body = await read_body(request)
    item = wire.JobItem(request_id=request.state.request_id, properties=request_properties(request), body=body)
    head, stream = await model.answer(item)
    if head.streaming:
        content_type = next((v for k, v in head.headers.items() if k.lower() == "content-type"), "")
        return StreamingResponse(_stream_body(stream, content_type), status_code=head.code, headers=head.headers)
    return Response(content=head.body, status_code=head.code, headers=head.headers)
