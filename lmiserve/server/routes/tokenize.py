"""``POST /tokenize``: TGI's body (``inputs``) or vLLM's (``prompt`` or ``messages``), told apart
by its shape; vLLM's ``POST /detokenize``. vLLM's bodies and errors are OpenAI-shaped."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ...errors import ModelNotReady
from ...formatters import vllm_tokenize
from ...formatters.shapes import json_object
from ...serving import TextModel
from ..bodies import read_body
from . import tgi
from .openai import model_and_adapter

router = APIRouter()


async def _model(request: Request, name: str | None) -> TextModel:
    """The model ``name`` names (an adapter's base model), its tokenizer loaded."""
    model, _ = await model_and_adapter(request, name)
    if model.tokenizer is None:
        raise ModelNotReady(f"model {model.name} is not ready")
    return model


def _token_ids(model: TextModel, req: vllm_tokenize.TokenizePrompt | vllm_tokenize.TokenizeChat) -> list[int]:
    if isinstance(req, vllm_tokenize.TokenizeChat):
        text = model.chat_prompt(
            req.template_messages(),
            req.tool_dicts,
            req.add_generation_prompt,
            req.continue_final_message,
            req.chat_template_kwargs,
        )
    else:
        text = req.prompt
    return list(model.tokenizer(text, add_special_tokens=req.add_special_tokens)["input_ids"])


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    request.state.protocol = "tgi"
    body = await read_body(request)
    try:
        data: Any = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError:
        data = None
    if not vllm_tokenize.is_vllm_tokenize(data):
        return await tgi.tokenize(request)
    request.state.protocol = "openai"
    req = vllm_tokenize.parse_tokenize(data)
    model = await _model(request, req.model)
    ids = _token_ids(model, req)
    strs = list(model.tokenizer.convert_ids_to_tokens(ids)) if req.return_token_strs else None
    return Response(vllm_tokenize.tokenize_body(ids, model.max_model_len, strs), media_type="application/json")


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    request.state.protocol = "openai"
    req = vllm_tokenize.parse_detokenize(json_object(await read_body(request)))
    model = await _model(request, req.model)
    vocab_size = max(len(model.tokenizer), getattr(model, "vocab_size", None) or 0)
    vllm_tokenize.check_ids(req.tokens, vocab_size)
    text = model.tokenizer.decode(req.tokens)
    return Response(vllm_tokenize.detokenize_body(text), media_type="application/json")
