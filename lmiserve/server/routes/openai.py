"""OpenAI-compatible routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``."""

from __future__ import annotations

import msgspec
import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ...errors import LmiServeError, NotFound, ValidationFailed
from ...formatters import openai_chat, openai_completions
from ...formatters.openai_chat_responder import ChatResponder
from ...formatters.openai_common import OPENAI_CHAT, OPENAI_COMPLETIONS, Style, now
from ...formatters.shapes import json_object
from ...generation import reasoning
from ...generation.request import GenerationRequest
from ...serving import EMBEDDING_HANDLER, EngineModel, HandlerModel, TextModel, generator_of, token_id
from ..bodies import read_body
from ..errors import error_response
from ..handler_response import handler_reply
from ..http_reply import http_response, respond_over_http

router = APIRouter()


async def text_model(request: Request, name: str | None) -> TextModel:
    """What generates text for the model ``name`` names: its engine, or its handler."""
    return await generator_of(request.app.state.registry.model(name))


async def model_and_adapter(request: Request, name: str | None) -> tuple[TextModel, str | None]:
    """The model a request's ``model`` names, or, where it names a LoRA adapter, the adapter's
    base model and the adapter (see :meth:`~lmiserve.serving.ModelRegistry.resolve`)."""
    model, adapter = request.app.state.registry.resolve(name)
    return await generator_of(model), adapter


def chat_prompt(model: TextModel, req: openai_chat.ChatRequest) -> str:
    return model.chat_prompt(
        req.template_messages(),
        req.tool_dicts if req.tool_mode != "none" else None,
        req.add_generation_prompt,
        req.continue_final_message,
        req.template_kwargs,
    )


def chat_responder(model: TextModel, req: openai_chat.ChatRequest, name: str, style: Style) -> ChatResponder:
    """The answer's formatter, splitting a reasoning model's thinking from its answer."""
    return ChatResponder(req, name, style, reasoning.for_request(model.reasoning_parser, req.template_kwargs))


def chat_generation(
    model: TextModel, req: openai_chat.ChatRequest, parser: reasoning.ReasoningParser | None
) -> GenerationRequest:
    """The chat request's generation: its conversation through the model's chat template (the text
    keeps special tokens where ``parser``'s markers are special tokens; a constraint on the output
    starts after the thinking)."""
    generation = openai_chat.generation_request(req, chat_prompt(model, req), model.max_model_len)
    if parser is not None and parser.special_tokens:
        generation.skip_special_tokens = False
    guided = generation.params.guided
    if parser is not None and guided is not None and parser.end_marker is not None:
        # the model thinks freely; the constraint holds from the end of its thinking
        after = token_id(model, parser.end_marker)
        if after is not None:
            guided = msgspec.structs.replace(guided, after=after)
            generation.params = msgspec.structs.replace(generation.params, guided=guided)
    return generation


async def completions(
    request: Request, data: dict, style: Style = OPENAI_COMPLETIONS, mindie: bool = False
) -> Response:
    req = openai_completions.parse(data, mindie)
    model, adapter = await model_and_adapter(request, req.model)
    responder = openai_completions.CompletionResponder(req, adapter or model.name, style)
    generations = openai_completions.generation_requests(req)
    for generation in generations:
        generation.adapter = adapter
    return await respond_over_http(model, generations, responder, request)


async def chat(request: Request, data: dict, style: Style = OPENAI_CHAT) -> Response:
    req = openai_chat.parse(data)
    model, adapter = await model_and_adapter(request, req.model)
    responder = chat_responder(model, req, adapter or model.name, style)
    generation = chat_generation(model, req, responder.reasoning)
    generation.adapter = adapter
    return await respond_over_http(model, [generation], responder, request)


async def _openai_body(request: Request) -> dict:
    request.state.protocol = "openai"
    return json_object(await read_body(request))


@router.post("/v1/completions")
async def v1_completions(request: Request) -> Response:
    return await completions(request, await _openai_body(request), mindie=True)


@router.post("/v1/chat/completions")
async def v1_chat_completions(request: Request) -> Response:
    return await chat(request, await _openai_body(request))


def embedding_model(request: Request, name: str | None) -> HandlerModel:
    model = request.app.state.registry.model(name)
    if not (isinstance(model, HandlerModel) and model.entry_point == EMBEDDING_HANDLER):
        raise NotFound(f"model {model.name} is not an embedding model")
    return model


async def embeddings(request: Request, data: dict, with_id: bool = False) -> Response:
    """Embeddings are computed by the embedding handler's workers (dynamically batched)."""
    protocol = request.state.protocol
    model = embedding_model(request, data.get("model") if isinstance(data.get("model"), str) else None)
    body = orjson.dumps({**data, "_with_id": with_id})
    reply = await handler_reply(model, request, body)
    if reply.status >= 400:  # the handler's error, in this protocol's shape
        payload = orjson.loads(reply.body)
        err = (
            ValidationFailed(payload.get("error", "invalid request"))
            if reply.status < 500
            else LmiServeError(payload.get("error", "failed"), status=reply.status)
        )
        return error_response(err, protocol)
    return http_response(reply)


@router.post("/v1/embeddings")
async def v1_embeddings(request: Request) -> Response:
    return await embeddings(request, await _openai_body(request))


@router.get("/v1/models")
async def v1_models(request: Request) -> Response:
    request.state.protocol = "openai"
    data = []
    for name, model in sorted(request.app.state.registry.models.items()):
        entry = {"id": name, "object": "model", "created": now(), "owned_by": "lmiserve"}
        if isinstance(model, EngineModel) and model.max_model_len:
            entry["max_model_len"] = model.max_model_len
        data.append(entry)
        for adapter in getattr(model, "adapters", None) and model.adapters.entries.values() or ():
            data.append(
                {
                    "id": adapter.name,
                    "object": "model",
                    "created": now(),
                    "owned_by": "lmiserve",
                    "root": adapter.src,
                    "parent": name,
                }
            )
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")
