"""``POST /invocations`` and ``POST /predictions/{model}[/{version}]``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from ... import wire
from ...errors import BadRequest, LmiServeError
from ..errors import stream_error_chunk
from ..handler_model import HandlerModel
from ..registry import ServedModel

router = APIRouter()

CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"


def parse_custom_attributes(value: str) -> dict[str, str]:
    """``k=v;k2=v2`` (SageMaker's X-Amzn-SageMaker-Custom-Attributes) as a dict."""
    result: dict[str, str] = {}
    for part in value.split(";"):
        if "=" in part:
            key, _, val = part.partition("=")
            if key.strip():
                result[key.strip()] = val.strip()
        elif part.strip():
            result[part.strip()] = ""
    return result


def request_properties(request: Request) -> dict[str, str]:
    """Headers, query parameters and custom attributes, as a handler's Input properties."""
    props: dict[str, str] = {}
    for raw_name, raw_value in request.scope.get("headers") or []:
        name = raw_name.decode("latin-1")
        value = raw_value.decode("latin-1")
        props[name] = value
        if name.lower() == CUSTOM_ATTRIBUTES:
            props.update(parse_custom_attributes(value))
    for key, value in request.query_params.items():
        props.setdefault(key, value)
    return props


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def read_body(request: Request) -> bytes:
    body = await request.body()
    if body and _is_json(request.headers.get("content-type", "")):
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
    return body


async def _stream_body(stream, content_type: str) -> AsyncIterator[bytes]:  # type: ignore[no-untyped-def]
    try:
        async for chunk in stream.chunks():
            yield chunk
    except LmiServeError as err:
        yield stream_error_chunk(err, content_type)


async def invoke_handler(model: HandlerModel, request: Request) -> Response:
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
