"""TGI / MindIE text generation: ``POST /``, ``/generate``, ``/generate_stream``; ``GET /info``,
``/health``; TGI's ``/tokenize`` (its route, shared with vLLM's body, is in :mod:`.tokenize`)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ... import __version__
from ...errors import BadRequest, ModelNotReady
from ...formatters import mindie_tgi, tgi
from ...serving import TextModel, generator_of
from ..bodies import read_body
from ..http_reply import respond_over_http

router = APIRouter()


async def text_model(request: Request, name: str | None = None) -> TextModel:
    """What generates text for the model: its engine, or its handler."""
    return await generator_of(request.app.state.registry.model(name))


async def _generate(request: Request, stream: bool) -> Response:
    request.state.protocol = "tgi"
    model = await text_model(request)
    parsed = tgi.parse(await read_body(request), stream)
    return await respond_over_http(model, [parsed.generation], tgi.TgiResponder(parsed), request)


@router.post("/")
async def compat_generate(request: Request) -> Response:
    """MindIE's text and stream inference: a one-element list, or SSE (``data: `` events whose
    ``token.id`` is a list) when the body says ``"stream": true``."""
    request.state.protocol = "tgi"
    model = await text_model(request)
    parsed = tgi.parse(await read_body(request), None, mindie=True)
    responder = mindie_tgi.MindieResponder(parsed, full_text=model.settings.model.full_text_enabled)
    return await respond_over_http(model, [parsed.generation], responder, request)


@router.post("/generate")
async def generate(request: Request) -> Response:
    return await _generate(request, False)


@router.post("/generate_stream")
async def generate_stream(request: Request) -> Response:
    return await _generate(request, True)


async def tokenize(request: Request) -> Response:
    """TGI's ``POST /tokenize``: ``{"inputs": "..."}``, each token with its text and offsets."""
    request.state.protocol = "tgi"
    model = await text_model(request)
    data = orjson.loads(await read_body(request) or b"{}")
    text = data.get("inputs") if isinstance(data, dict) else None
    if not isinstance(text, str):
        raise BadRequest('the body must be {"inputs": "..."}')
    if model.tokenizer is None:
        raise ModelNotReady(f"model {model.name} is not ready")
    encoding = model.tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    return Response(tgi.tokenize_body(text, encoding), media_type="application/json")


@router.get("/info")
async def info(request: Request) -> Response:
    request.state.protocol = "tgi"
    model = await text_model(request)
    engine = dict(model.client.info) if model.client else {}
    max_len = int(engine.get("max_model_len", 0) or model.max_model_len)
    body = {
        "model_id": model.name,
        "model_sha": None,
        "model_dtype": engine.get("dtype"),
        "model_device_type": engine.get("device"),
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": model.settings.model.job_queue_size,
        "max_best_of": tgi.MAX_BEST_OF,
        "max_stop_sequences": tgi.MAX_STOP_SEQUENCES,
        "max_input_tokens": max(0, max_len - 1),
        "max_input_length": max(0, max_len - 1),
        "max_total_tokens": max_len,
        "max_batch_total_tokens": engine.get("kv_tokens"),
        "max_batch_size": engine.get("max_num_seqs"),
        "max_client_batch_size": 1,
        "validation_workers": 1,
        "router": "lmiserve",
        "version": __version__,
        "sha": None,
        "docker_label": None,
    }
    return Response(orjson.dumps(body), media_type="application/json")


@router.get("/health", response_class=Response, responses={200: {"description": "Healthy; empty body"}})
async def health(request: Request) -> Response:
    healthy, _ = request.app.state.registry.ping()
    return Response(status_code=200 if healthy else 503)
