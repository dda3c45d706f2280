"""OpenAI-compatible routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ...errors import NotFound
from ...formatters import openai_chat, openai_completions
from ...formatters.openai_common import now
from ..bodies import read_body
from ..engine_model import EngineModel
from ..generation import respond

router = APIRouter()


def engine_model(request: Request, name: str | None) -> EngineModel:
    registry = request.app.state.registry
    model = registry.get(name) if name and name in registry.models else registry.resolve(None if name is None else name)
    if not isinstance(model, EngineModel):
        raise NotFound(f"model {model.name} does not generate text through the engine")
    return model


async def completions(
    request: Request, data: dict, object_name: str = "text_completion", mindie_usage: bool = True
) -> Response:
    req = openai_completions.parse(data)
    model = engine_model(request, req.model)
    responder = openai_completions.CompletionResponder(req, model.name, object_name, mindie_usage)
    return await respond(model, openai_completions.generation_requests(req), responder, request)


async def chat(
    request: Request, data: dict, object_name: str = "chat.completion", mindie_usage: bool = True
) -> Response:
    req = openai_chat.parse(data)
    model = engine_model(request, req.model)
    prompt = model.chat_prompt(
        req.template_messages(),
        req.tool_dicts if req.tool_mode != "none" else None,
        req.add_generation_prompt,
        req.continue_final_message,
    )
    generation = openai_chat.generation_request(req, prompt, model.max_model_len)
    responder = openai_chat.ChatResponder(req, model.name, object_name, mindie_usage)
    return await respond(model, [generation], responder, request)


@router.post("/v1/completions")
async def v1_completions(request: Request) -> Response:
    request.state.protocol = "openai"
    return await completions(request, openai_completions.parse_body(await read_body(request)))


@router.post("/v1/chat/completions")
async def v1_chat_completions(request: Request) -> Response:
    request.state.protocol = "openai"
    return await chat(request, openai_completions.parse_body(await read_body(request)))


@router.get("/v1/models")
async def v1_models(request: Request) -> Response:
    request.state.protocol = "openai"
    data = []
    for name, model in sorted(request.app.state.registry.models.items()):
        entry = {"id": name, "object": "model", "created": now(), "owned_by": "lmiserve"}
        if isinstance(model, EngineModel) and model.max_model_len:
            entry["max_model_len"] = model.max_model_len
        data.append(entry)
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")
