"""``POST /invocations`` and ``POST /predictions/{model}[/{version}]``.

A handler model (a user's ``model.py``) gets every body as it is. For the built-in models the
body's shape picks the protocol (see :mod:`lmiserve.formatters.shapes`): LMI/TGI ``inputs``,
OpenAI ``prompt`` or ``messages`` (answered in OpenAI's shapes, streamed as JSON lines unless
``option.output_formatter=sse``), embedding ``input``, or a KServe V2 inference request.
With ``option.bedrock_compat`` every body but ``inputs`` and ``messages`` is Amazon Bedrock's
Meta Llama schema (see :mod:`lmiserve.formatters.bedrock`).
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ...errors import BadRequest
from ...formatters.openai_common import JSONLINES_FRAMING, SSE_FRAMING, Style
from ...formatters.shapes import invocation_shape
from ..bedrock import invoke_bedrock, is_bedrock_body
from ..bodies import read_body
from ..engine_model import EngineModel
from ..handler_model import HandlerModel
from ..handler_response import invoke_handler
from ..model_factory import EMBEDDING_HANDLER, TEXT_GENERATION_HANDLER
from ..registry import ServedModel
from ..rolling import invoke_rolling
from .kserve import kserve_infer
from .openai import chat, completions, embeddings

router = APIRouter()


def _json(body: bytes) -> object:
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None


def _styles(model: EngineModel) -> tuple[Style, Style]:
    framing = SSE_FRAMING if model.settings.model.output_formatter == "sse" else JSONLINES_FRAMING
    return (
        Style("text_completion", framing=framing, mindie_usage=False),
        Style("chat.completion", framing=framing, mindie_usage=False),
    )


async def invoke(model: ServedModel, request: Request) -> Response:
    if isinstance(model, HandlerModel):
        # the built-in dynamic-batch handler answers a malformed body itself (424, LMI's schema)
        body = await request.body() if model.entry_point == TEXT_GENERATION_HANDLER else await read_body(request)
        if model.entry_point == EMBEDDING_HANDLER:
            data = _json(body)
            if invocation_shape(data) == "embeddings":
                request.state.protocol = "openai"
                return await embeddings(request, {**data, "model": model.name})  # type: ignore[dict-item]
        return await invoke_handler(model, request, body)
    if not isinstance(model, EngineModel):
        raise BadRequest(f"model {model.name} does not serve this route")
    if model.custom_formatters and model.custom_formatters.input is not None:
        return await invoke_rolling(model, request)  # the input formatter reads every body
    if model.settings.model.bedrock_compat:
        raw = await request.body()
        if is_bedrock_body(_json(raw)):
            return await invoke_bedrock(model, request, raw)
    body = await request.body()  # not JSON: the LMI schema's payload validation answers it (424)
    data = _json(body)
    shape = invocation_shape(data)
    completions_style, chat_style = _styles(model)
    if shape == "chat":
        request.state.protocol = "openai"
        return await chat(request, {**data, "model": model.name}, chat_style)  # type: ignore[dict-item]
    if shape == "completions":
        request.state.protocol = "openai"
        return await completions(request, {**data, "model": model.name}, completions_style)  # type: ignore[dict-item]
    if shape == "embeddings":
        request.state.protocol = "openai"
        return await embeddings(request, {**data, "model": model.name})  # type: ignore[dict-item]
    if shape == "kserve":
        return await kserve_infer(request, model.name, data)  # type: ignore[arg-type]
    return await invoke_rolling(model, request)


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
