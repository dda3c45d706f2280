"""DJL's Adapters Management API: register, update, describe, list and unregister a model's
LoRA adapters while the server runs.

``/models/{model}/adapters[...]``, and ``/adapters[...]`` where the server has one model. The
answers are DJL's: ``{"status": "Adapter NAME registered"}`` (updated, unregistered), an adapter
as ``{"name", "src", "preload", "pin"}``, a list as ``{"adapters": [...], "nextPageToken"}``; a
model or adapter that is not there is 404, a name registered twice 409, an adapter that cannot
be loaded 424, no device slot left to pin it in 507, LoRA not enabled 400.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ...errors import BadRequest, LmiServeError, ModelNotReady, NotFound
from ...serving import EngineModel
from .management import query_flag

router = APIRouter()


def _model(request: Request, name: str | None) -> EngineModel:
    try:
        model = request.app.state.registry.model(name)
    except LmiServeError:  # in DJL's words
        if name is None:
            raise BadRequest(
                "The adapter must be prefixed with a model unless there is only a single startup model used."
            ) from None
        raise NotFound(f"The model {name} was not found") from None
    if not isinstance(model, EngineModel):
        raise BadRequest("LoRA is not enabled.")
    model.adapters.check_enabled()
    return model


def _client(model: EngineModel):  # type: ignore[no-untyped-def]
    if model.client is None or not model.client.alive:
        raise ModelNotReady(f"model {model.name} is not ready")
    return model.client


async def _register(request: Request, model_name: str | None) -> JSONResponse:
    model = _model(request, model_name)
    name = request.query_params.get("name") or ""
    if not name:
        raise BadRequest("Parameter name is required.")
    src = request.query_params.get("src") or ""
    if not src:
        raise BadRequest("Parameter src is required.")
    preload, pin = query_flag(request, "preload", True), query_flag(request, "pin", False)
    await model.adapters.register(_client(model), name, src, preload, pin)
    return JSONResponse({"status": f"Adapter {name} registered"})


async def _list(request: Request, model_name: str | None) -> JSONResponse:
    model = _model(request, model_name)
    try:
        limit = int(request.query_params.get("limit", 100))
        start = int(request.query_params.get("next_page_token", 0))
    except ValueError:
        raise BadRequest("limit and next_page_token must be whole numbers") from None
    if limit < 1 or start < 0:
        raise BadRequest("limit must be >= 1 and next_page_token >= 0")
    entries = list(model.adapters.entries.values())
    body: dict[str, object] = {"adapters": [a.describe() for a in entries[start : start + limit]]}
    if start + limit < len(entries):
        body["nextPageToken"] = str(start + limit)
    return JSONResponse(body)


async def _update(request: Request, model_name: str | None, name: str) -> JSONResponse:
    model = _model(request, model_name)
    info = model.adapters.get(name)
    src = request.query_params.get("src")
    if src and src != info.src:
        raise LmiServeError("Updating adapter path is not supported.", status=424)
    preload = query_flag(request, "preload", info.preload) if "preload" in request.query_params else None
    pin = query_flag(request, "pin", info.pin) if "pin" in request.query_params else None
    await model.adapters.update(_client(model), name, preload, pin)
    return JSONResponse({"status": f"Adapter {name} updated"})


async def _unregister(request: Request, model_name: str | None, name: str) -> JSONResponse:
    model = _model(request, model_name)
    await model.adapters.unregister(_client(model), name)
    return JSONResponse({"status": f"Adapter {name} unregistered"})


# each route twice: under /models/{model_name}, and without it for the server's only model


def _names(request: Request) -> tuple[str | None, str]:
    """The model the path names (None: the only one) and the adapter it names ("" for none)."""
    return request.path_params.get("model_name"), request.path_params.get("name", "")


@router.post("/models/{model_name}/adapters")
@router.post("/adapters")
async def register(request: Request) -> JSONResponse:
    return await _register(request, _names(request)[0])


@router.get("/models/{model_name}/adapters")
@router.get("/adapters")
async def list_adapters(request: Request) -> JSONResponse:
    return await _list(request, _names(request)[0])


@router.get("/models/{model_name}/adapters/{name:path}")
@router.get("/adapters/{name:path}")
async def describe(request: Request) -> JSONResponse:
    model_name, name = _names(request)
    return JSONResponse(_model(request, model_name).adapters.get(name).describe())


@router.post("/models/{model_name}/adapters/{name:path}/update")
@router.post("/adapters/{name:path}/update")
async def update(request: Request) -> JSONResponse:
    return await _update(request, *_names(request))


@router.delete("/models/{model_name}/adapters/{name:path}")
@router.delete("/adapters/{name:path}")
async def unregister(request: Request) -> JSONResponse:
    return await _unregister(request, *_names(request))
