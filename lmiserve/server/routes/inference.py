"""``POST /invocations`` and ``POST /predictions/{model}[/{version}]``.

A handler model (a user's ``model.py``) gets every body as it is. For the built-in models the
body's shape picks the protocol (see :mod:`lmiserve.formatters.shapes`): LMI/TGI ``inputs``,
OpenAI ``prompt`` or ``messages`` (answered in OpenAI's shapes, streamed as JSON lines unless
``option.output_formatter=sse``), embedding ``input``, or a KServe V2 inference request.
With ``option.bedrock_compat`` every body but ``inputs`` and ``messages`` is Amazon Bedrock's
Meta Llama schema (see :mod:`lmiserve.formatters.bedrock`).

Which model: ``model_name`` (query or header), ``X-Model-Name`` or SageMaker's
``X-Amzn-SageMaker-Target-Model``; else the ``X-Amzn-SageMaker-Inference-Component`` SageMaker sends,
where it names a model of this server; else the only model. In multi-model mode a named model not
loaded yet is loaded from the model root first, and ``POST /models/{name}/invoke`` (SageMaker's
multi-model call) answers 404 for a model not loaded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from ...errors import BadRequest, NotFound
from ...formatters.openai_common import JSONLINES_FRAMING, SSE_FRAMING, Style
from ...formatters.shapes import decode, invocation_shape
from ...serving import (
    EMBEDDING_HANDLER,
    TEXT_GENERATION_HANDLER,
    EngineModel,
    HandlerModel,
    Lease,
    ModelPool,
    ServedModel,
)
from ..bodies import read_body, requested_adapter
from ..handler_response import invoke_handler
from ..metrics import STATE_KEY
from .bedrock import invoke_bedrock, is_bedrock_body
from .kserve import kserve_infer
from .openai import chat, completions, embeddings
from .rolling import invoke_rolling

router = APIRouter()

TARGET_MODEL = "x-amzn-sagemaker-target-model"
INFERENCE_COMPONENT = "x-amzn-sagemaker-inference-component"


def _styles(model: EngineModel) -> tuple[Style, Style]:
    framing = SSE_FRAMING if model.settings.model.output_formatter == "sse" else JSONLINES_FRAMING
    return (
        Style("text_completion", framing=framing, mindie_usage=False),
        Style("chat.completion", framing=framing, mindie_usage=False),
    )


Invoke = Callable[[Request, EngineModel, bytes, Any], Awaitable[Response]]


def _served(request: Request, model: EngineModel, data: Any) -> str:
    """The name an OpenAI-shaped body on /invocations is served under: the model's, or the LoRA
    adapter's that the header or the body's ``adapters`` names (checked here: a name the model
    does not have is refused as a validation error)."""
    adapter = requested_adapter(request) or (data.get("adapters") if isinstance(data.get("adapters"), str) else None)
    return model.adapters.check_request(adapter) or model.name


async def _chat(request: Request, model: EngineModel, body: bytes, data: Any) -> Response:
    request.state.protocol = "openai"
    return await chat(request, {**data, "model": _served(request, model, data)}, _styles(model)[1])


async def _completions(request: Request, model: EngineModel, body: bytes, data: Any) -> Response:
    request.state.protocol = "openai"
    return await completions(request, {**data, "model": _served(request, model, data)}, _styles(model)[0])


async def _embeddings(request: Request, model: EngineModel, body: bytes, data: Any) -> Response:
    request.state.protocol = "openai"
    return await embeddings(request, {**data, "model": model.name})


async def _kserve(request: Request, model: EngineModel, body: bytes, data: Any) -> Response:
    return await kserve_infer(request, model.name, data)


async def _lmi(request: Request, model: EngineModel, body: bytes, data: Any) -> Response:
    return await invoke_rolling(model, request, body, data)


BY_SHAPE: dict[str, Invoke] = {
    "chat": _chat,
    "completions": _completions,
    "embeddings": _embeddings,
    "kserve": _kserve,
    "lmi": _lmi,
}
"""What answers each body shape on ``/invocations`` (:func:`lmiserve.formatters.shapes.invocation_shape`)."""


async def invoke(model: ServedModel, request: Request) -> Response:
    if isinstance(model, HandlerModel):
        # the built-in dynamic-batch handler answers a malformed body itself (424, LMI's schema)
        body = await request.body() if model.entry_point == TEXT_GENERATION_HANDLER else await read_body(request)
        if model.entry_point == EMBEDDING_HANDLER:
            data = decode(body)
            if invocation_shape(data) == "embeddings":
                return await _embeddings(request, model, body, data)  # type: ignore[arg-type]
        return await invoke_handler(model, request, body)
    if not isinstance(model, EngineModel):
        raise BadRequest(f"model {model.name} does not serve this route")
    if model.custom_formatters and model.custom_formatters.input is not None:
        return await invoke_rolling(model, request)  # the input formatter reads every body
    body = await request.body()  # not JSON: the LMI schema's payload validation answers it (424)
    data = decode(body)  # once, for the shape and the parser
    if model.settings.model.bedrock_compat and is_bedrock_body(data):
        return await invoke_bedrock(model, request, body, data)
    return await BY_SHAPE[invocation_shape(data)](request, model, body, data)


def _named_model(request: Request) -> str | None:
    return (
        request.query_params.get("model_name")
        or request.headers.get("model_name")
        or request.headers.get("x-model-name")
        or request.headers.get(TARGET_MODEL)
    )


def _component(request: Request, known: Callable[[str], bool]) -> str | None:
    """The inference component SageMaker names, where it is a model this server has."""
    name = request.headers.get(INFERENCE_COMPONENT)
    return name if name and known(name) else None


class _Leased(Response):
    """A response that holds its model's lease until the last byte is sent (or the client left)."""

    def __init__(self, inner: Response, lease: Lease):
        self.inner, self.lease = inner, lease
        self.status_code, self.background, self.raw_headers = inner.status_code, None, inner.raw_headers

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        try:
            await self.inner(scope, receive, send)
        finally:
            self.lease.release()


async def invoke_pooled(pool: ModelPool, request: Request, name: str | None, load: bool) -> Response:
    """Multi-model mode: the named model (loaded on demand where ``load``), or the only one loaded."""
    if name is None:
        name = _component(request, lambda n: n in pool.resident() or _under_root(pool, n))
    if name is None:
        resident = pool.resident()
        if len(resident) != 1:
            loaded = f"several models are loaded ({', '.join(resident)})" if resident else "no model is loaded"
            raise BadRequest(f"{loaded}; name one with the X-Amzn-SageMaker-Target-Model header (multi-model mode)")
        name = resident[0]
    lease = await pool.acquire(name, load=load)
    try:
        setattr(request.state, STATE_KEY, lease.model.name)
        return _Leased(await invoke(lease.model, request), lease)
    except BaseException:
        lease.release()
        raise


def _under_root(pool: ModelPool, name: str) -> bool:
    try:
        pool.find(name)
    except NotFound:
        return False
    return True


@router.post("/invocations")
async def invocations(request: Request) -> Response:
    pool = request.app.state.pool
    if pool is not None:
        return await invoke_pooled(pool, request, _named_model(request), load=True)
    registry = request.app.state.registry
    name = _named_model(request) or _component(request, lambda n: n in registry.models)
    return await invoke(registry.model(name), request)


@router.post("/models/{model_name}/invoke")
async def invoke_loaded(model_name: str, request: Request) -> Response:
    """SageMaker's multi-model invoke call: 404 when the model is not loaded."""
    pool = request.app.state.pool
    if pool is None:
        return await invoke(request.app.state.registry.model(model_name), request)
    return await invoke_pooled(pool, request, model_name, load=False)


@router.post("/predictions/{model_name}")
async def predictions(model_name: str, request: Request) -> Response:
    pool = request.app.state.pool
    if pool is not None:
        return await invoke_pooled(pool, request, model_name, load=True)
    return await invoke(request.app.state.registry.model(model_name), request)


@router.post("/predictions/{model_name}/{version}")
async def predictions_version(model_name: str, version: str, request: Request) -> Response:
    return await predictions(model_name, request)
