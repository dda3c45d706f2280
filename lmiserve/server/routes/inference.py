"""``POST /invocations`` and ``POST /predictions/{model}[/{version}]``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from ... import wire
from ...errors import BadRequest, LmiServeError
from ..bodies import read_body, request_properties
from ..engine_model import EngineModel
from ..errors import stream_error_chunk
from ..handler_model import HandlerModel
from ..registry import ServedModel
from ..rolling import invoke_rolling

router = APIRouter()


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
    stream = model.submit(item)
    try:
        head = await stream.head
    except asyncio.CancelledError:
        model.cancel(stream)
        raise
    if head.streaming:
        content_type = next((v for k, v in head.headers.items() if k.lower() == "content-type"), "")
        return StreamingResponse(_stream_body(stream, content_type), status_code=head.code, headers=head.headers)
    return Response(content=head.body, status_code=head.code, headers=head.headers)


async def invoke(model: ServedModel, request: Request) -> Response:
    if isinstance(model, HandlerModel):
        return await invoke_handler(model, request)
    if isinstance(model, EngineModel):
        return await invoke_rolling(model, request)
    raise BadRequest(f"model {model.name} does not serve this route")


def _named_model(request: Request) -> str | None:
    return (
        request.query_params.get("model_name")
        or request.headers.get("model_name")
        or request.headers.get("x-model-name")
    )


@router.post("/invocations")
async def invocations(request: Request) -> Response:
    model = request.app.state.registry.resolve(_named_model(request))
    return await invoke(model, request)


@router.post("/predictions/{model_name}")
async def predictions(model_name: str, request: Request) -> Response:
    return await invoke(request.app.state.registry.get(model_name), request)


@router.post("/predictions/{model_name}/{version}")
async def predictions_version(model_name: str, version: str, request: Request) -> Response:
    return await invoke(request.app.state.registry.get(model_name), request)
