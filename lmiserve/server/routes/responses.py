"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

A request runs as the chat request it amounts to (the conversation through the model's chat
template, ``text.format`` and forced tool calls by constrained decoding); the answer is a response
object or its stream of events. Responses asked to be stored (``store``, true by default) are kept
in the app's :class:`~lmiserve.serving.response_store.ResponseStore`, for ``GET`` and for a later
request's ``previous_response_id``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from ...errors import NotFound
from ...formatters import json_wire
from ...formatters.responses_input import chat_messages, input_items
from ...formatters.responses_request import parse
from ...formatters.responses_responder import ResponsesResponder
from ...formatters.shapes import json_object
from ...generation import reasoning
from ...serving import ResponseStore
from ..bodies import read_body
from ..http_reply import respond_over_http
from .openai import chat_generation, model_and_adapter

router = APIRouter()


def response_store(request: Request) -> ResponseStore:
    return request.app.state.responses


def not_found(response_id: str, param: str | None = None) -> NotFound:
    err = NotFound(f"Response with id '{response_id}' not found.")
    err.param = param  # type: ignore[attr-defined]
    return err


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    request.state.protocol = "openai"
    req = parse(json_object(await read_body(request)))
    store = response_store(request)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        previous = store.get(req.previous_response_id)
        if previous is None:
            raise not_found(req.previous_response_id, "previous_response_id")
        history = previous.conversation
    conversation = history + input_items(req.input)
    chat = req.chat_request(chat_messages(conversation, req.instructions))
    model, adapter = await model_and_adapter(request, req.model)
    parser = reasoning.for_request(model.reasoning_parser, chat.template_kwargs)
    generation = chat_generation(model, chat, parser)
    generation.adapter = adapter

    def keep(body: dict[str, Any]) -> None:
        store.put(body, conversation + body["output"])

    responder = ResponsesResponder(req, chat, adapter or model.name, parser, keep if req.store else None)
    return await respond_over_http(model, [generation], responder, request)


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    request.state.protocol = "openai"
    stored = response_store(request).get(response_id)
    if stored is None:
        raise not_found(response_id)
    return Response(json_wire.dumps(stored.response), media_type="application/json")


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    request.state.protocol = "openai"
    if not response_store(request).delete(response_id):
        raise not_found(response_id)
    body = {"id": response_id, "object": "response", "deleted": True}
    return Response(json_wire.dumps(body), media_type="application/json")
