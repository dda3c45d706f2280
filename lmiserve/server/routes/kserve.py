"""KServe V2 (Open Inference Protocol) over REST: health, metadata, ``infer`` (with the binary
tensor extension) and the ``generate`` / ``generate_stream`` extension. Errors are
``{"error": "..."}``."""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ...errors import BadRequest, HandlerFailure, PayloadTooLarge
from ...formatters import kserve, kserve_generate, kserve_handler
from ...serving import HandlerModel, generator_of
from .. import deadline
from ..data_plane import DataPlane
from ..handler_response import handler_reply
from ..http_reply import http_response, respond_over_http, wait_for_disconnect
from ..metrics import STATE_KEY
from ..tenant import tenant_of

router = APIRouter()

_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _plane(request: Request) -> DataPlane:
    request.state.protocol = "kserve"
    return request.app.state.plane


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def _body(request: Request) -> bytes:
    """The request body, inflated when it was sent gzip- or deflate-compressed."""
    body = await request.body()
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in _DECODERS:
        raise BadRequest(f"Content-Encoding {encoding!r} is not supported (gzip, deflate)")
    limit = request.app.state.settings.server.max_request_size
    inflater = zlib.decompressobj(_DECODERS[encoding])
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadRequest(f"the body is not valid {encoding} data: {exc}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"the inflated request body exceeds max_request_size ({limit} bytes)")
    if not inflater.eof:
        raise BadRequest(f"the {encoding} body ends early")
    return data


async def _infer(request: Request, name: str | None, version: str, req: kserve.InferRequest) -> Response:
    plane = _plane(request)
    model = await plane.text_model(name, version)
    setattr(request.state, STATE_KEY, model.name)  # the metrics' model label
    seconds = deadline.budget(request, float(model.settings.model.predict_timeout))
    tenant = tenant_of(request, model.settings)
    reply, _ = await plane.infer_reply(model, req, seconds, lambda: wait_for_disconnect(request), tenant)
    return http_response(reply)


async def kserve_infer(request: Request, model_name: str | None, data: dict) -> Response:
    """Answer a V2 inference request whose JSON body is already parsed (``/invocations``)."""
    request.state.protocol = "kserve"
    return await _infer(request, model_name, "", kserve.parse_infer(data))


# --- health and metadata -----------------------------------------------------------------


@router.get("/v2")
async def server_metadata(request: Request) -> Response:
    return _json(_plane(request).server_metadata())


@router.get("/v2/health/live")
async def server_live(request: Request) -> Response:
    return _json({"live": _plane(request).live()})


@router.get("/v2/health/ready")
async def server_ready(request: Request) -> Response:
    ready = _plane(request).ready()
    return _json({"ready": ready}, 200 if ready else 503)


@router.get("/v2/models/{model_name}")
@router.get("/v2/models/{model_name}/versions/{version}")
async def model_metadata(request: Request, model_name: str, version: str = "") -> Response:
    return _json(_plane(request).model_metadata(model_name, version))


@router.get("/v2/models/{model_name}/ready")
@router.get("/v2/models/{model_name}/versions/{version}/ready")
async def model_ready(request: Request, model_name: str, version: str = "") -> Response:
    plane = _plane(request)
    ready = plane.model_ready(model_name, version)
    return _json({"name": plane.model(model_name).name, "ready": ready}, 200 if ready else 503)


# --- inference ---------------------------------------------------------------------------


@router.post("/v2/models/{model_name}/infer")
@router.post("/v2/models/{model_name}/versions/{version}/infer")
async def infer(request: Request, model_name: str, version: str = "") -> Response:
    model = _plane(request).model(model_name, version)  # an unknown model is 404 whatever the body
    if DataPlane.takes_tensors(model):
        return await _infer_handler(request, model)  # type: ignore[arg-type]
    await _plane(request).text_model(model_name, version)
    data, binary = kserve.split_binary(await _body(request), request.headers.get(kserve.HEADER_LENGTH))
    return await _infer(request, model_name, version, kserve.parse_infer(data, binary))


async def _infer_handler(request: Request, model: HandlerModel) -> Response:
    """A user's handler gets the V2 request as it came and answers with output tensors."""
    body = await _body(request)
    kserve.parse_infer(*kserve.split_binary(body, request.headers.get(kserve.HEADER_LENGTH)))  # a V2 request?
    reply = await handler_reply(model, request, body)
    if reply.status != 200:
        return http_response(reply)  # the handler's own error
    if reply.chunks is not None:
        raise HandlerFailure("the handler streamed its answer; V2 inference needs one body of output tensors")
    data = kserve_handler.handler_response(model.name, kserve_handler.request_id(body), bytes(reply.body))
    return Response(data, media_type="application/json")


async def _generate(request: Request, model_name: str, version: str, stream: bool) -> Response:
    model = await generator_of(_plane(request).model(model_name, version))  # any handler's too: not tensors
    body = await _body(request)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    prompt, params = kserve_generate.parse_generate(data)
    responder = kserve_generate.GenerateResponder(model.name, params, stream)
    return await respond_over_http(model, [params.request(prompt)], responder, request)


@router.post("/v2/models/{model_name}/generate")
@router.post("/v2/models/{model_name}/versions/{version}/generate")
async def generate(request: Request, model_name: str, version: str = "") -> Response:
    return await _generate(request, model_name, version, stream=False)


@router.post("/v2/models/{model_name}/generate_stream")
@router.post("/v2/models/{model_name}/versions/{version}/generate_stream")
async def generate_stream(request: Request, model_name: str, version: str = "") -> Response:
    return await _generate(request, model_name, version, stream=True)
