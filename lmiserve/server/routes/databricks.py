"""Databricks serving endpoints: ``POST /serving-endpoints/{name}/invocations`` (chat,
completions or embeddings, by the body), and the workspace's OpenAI-compatible paths
``/serving-endpoints/chat/completions``, ``/completions`` and ``/embeddings``.

``{name}`` is the served model's name; a server with one model answers for any name, as a
Databricks endpoint answers for the model behind it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from ...errors import NotFound
from ...formatters import databricks, openai_completions
from ...formatters.openai_common import Style
from ...formatters.shapes import json_object
from ...serving import ServedModel, TextModel
from ..bodies import read_body
from ..http_reply import respond_over_http
from .openai import chat_generation, chat_responder, embeddings, text_model

router = APIRouter()


def _endpoint_model(request: Request, name: str) -> tuple[ServedModel, str | None]:
    """The model an endpoint name (or a body's ``model``) names, and the LoRA adapter when the
    name is an adapter's."""
    registry = request.app.state.registry
    try:
        return registry.resolve(name)
    except NotFound:
        if len(registry.models) != 1:
            raise
        return registry.resolve(None)


async def _completions(request: Request, model: TextModel, data: dict, adapter: str | None) -> Response:
    req = databricks.parse_completion(data)
    templated = None
    if not req.use_raw_prompt and getattr(model.tokenizer, "chat_template", None):
        texts = [text for text, ids in req.prompts() if ids is None]
        templated = [model.chat_prompt([{"role": "user", "content": t}], None) for t in texts] or None
    generations = databricks.completion_requests(req, model.max_model_len, templated)
    for generation in generations:
        generation.adapter = adapter
    responder = openai_completions.CompletionResponder(req, adapter or model.name, databricks.COMPLETIONS)
    responder.truncate_on_timeout = req.error_behavior == "truncate"
    if templated is not None:
        responder.echo_prompts = [text for text, _ in req.prompts()]
    return await respond_over_http(model, generations, responder, request)


async def _chat(request: Request, model: TextModel, data: dict, style: Style, adapter: str | None) -> Response:
    req = databricks.parse_chat(data)
    responder = chat_responder(model, req, adapter or model.name, style)
    generation = chat_generation(model, req, responder.reasoning)
    generation.adapter = adapter
    return await respond_over_http(model, [generation], responder, request)


async def _task(
    request: Request, found: tuple[ServedModel, str | None], data: dict, task: str, chat_style: Style
) -> Response:
    model, adapter = found
    if task == "embeddings":
        return await embeddings(request, {**data, "model": model.name}, with_id=True)
    engine = await text_model(request, model.name)
    if task == "chat":
        return await _chat(request, engine, data, chat_style, adapter)
    return await _completions(request, engine, data, adapter)


@router.post("/serving-endpoints/{name}/invocations")
async def invocations(name: str, request: Request) -> Response:
    request.state.protocol = "databricks"
    data = json_object(await read_body(request))
    task = databricks.task_of(data)
    return await _task(request, _endpoint_model(request, name), data, task, databricks.CHAT)


async def _openai_path(request: Request, task: str) -> Response:
    request.state.protocol = "databricks"
    data = json_object(await read_body(request))
    name = data.get("model") if isinstance(data.get("model"), str) else ""
    found = _endpoint_model(request, name) if name else request.app.state.registry.resolve(None)
    return await _task(request, found, data, task, databricks.OPENAI_CHAT)


@router.post("/serving-endpoints/chat/completions")
async def openai_chat_path(request: Request) -> Response:
    return await _openai_path(request, "chat")


@router.post("/serving-endpoints/completions")
async def openai_completions_path(request: Request) -> Response:
    return await _openai_path(request, "completions")


@router.post("/serving-endpoints/embeddings")
async def openai_embeddings_path(request: Request) -> Response:
    return await _openai_path(request, "embeddings")
