"""The management API, the DJL way: list, describe, register, scale and unregister models.

In multi-model mode the same routes follow SageMaker's multi-model container contract: load
(``POST /models`` with ``{"model_name", "url"}``: 200, 409 when loaded, 507 when it does not fit),
list, get (one object, 404 when not loaded) and unload (``DELETE``, 404 when not loaded).
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ...errors import BadRequest, NotFound
from ...serving import ModelAdmin

router = APIRouter()


@router.get("/models")
async def list_models(request: Request, limit: int = 100, next_page_token: int = 0) -> JSONResponse:
    if limit < 1 or next_page_token < 0:
        raise BadRequest("limit must be >= 1 and next_page_token >= 0")
    registry = request.app.state.registry
    names = sorted(registry.models)
    page = names[next_page_token : next_page_token + limit]
    body: dict[str, object] = {
        "models": [
            {
                "modelName": n,
                "modelUrl": str(registry.models[n].settings.model_dir),
                "status": registry.models[n].status,
            }
            for n in page
        ]
    }
    if next_page_token + limit < len(names):
        body["nextPageToken"] = str(next_page_token + limit)
    return JSONResponse(body)


@router.get("/models/{model_name}")
async def describe_model(model_name: str, request: Request) -> JSONResponse:
    pool = request.app.state.pool
    if pool is not None:  # SageMaker's multi-model contract: one object, 404 when not loaded
        if model_name not in pool.resident():
            raise NotFound(f"model {model_name!r} is not loaded")
        return JSONResponse({"modelName": model_name, "modelUrl": pool.url(model_name)})
    model = request.app.state.registry.get(model_name)
    cfg = model.settings.model
    description = {
        "modelName": model.name,
        "modelUrl": str(model.settings.model_dir),
        "engine": cfg.engine,
        "rollingBatch": cfg.rolling_batch,
        "batchSize": cfg.batch_size,
        "maxBatchDelay": cfg.max_batch_delay,
        "maxIdleTime": cfg.max_idle_time,
        "minWorkers": cfg.min_workers,
        "maxWorkers": cfg.max_workers,
        "queueSize": cfg.job_queue_size,
        **model.describe(),
    }
    return JSONResponse([description])


def _admin(request: Request) -> ModelAdmin:
    return request.app.state.admin


def query_flag(request: Request, name: str, default: bool) -> bool:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise BadRequest(f"{name} must be true or false, not {value!r}")


def _count(request: Request, name: str) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, not {value!r}") from None


async def _load_body(request: Request) -> tuple[str, str]:
    """SageMaker's multi-model load call: ``{"model_name": ..., "url": ...}`` as JSON."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("url"), str) or not body["url"]:
        raise BadRequest('url is required: the model directory to load (?url=... or {"model_name": ..., "url": ...})')
    name = body.get("model_name")
    if not isinstance(name, str) or not name:
        raise BadRequest("model_name is required: the name the model is loaded and invoked under")
    return name, body["url"]


@router.post("/models")
async def register_model(request: Request) -> JSONResponse:
    """``POST /models?url=...&model_name=...&min_worker=...&synchronous=true``, or SageMaker's
    multi-model load call with a JSON body (200; 409 when loaded already; 507 when it does not fit)."""
    url = request.query_params.get("url")
    params = dict(request.query_params)
    if not url:
        params["model_name"], url = await _load_body(request)
    pool = request.app.state.pool
    if pool is not None:
        if not params.get("model_name"):
            raise BadRequest("model_name is required in multi-model mode")
        name = params.pop("model_name")
        await pool.load(name, url, params)
        return JSONResponse({"status": f'Model "{name}" registered.'})
    synchronous = query_flag(request, "synchronous", True)
    model = await _admin(request).register(url, params, synchronous)
    if synchronous:
        return JSONResponse({"status": f'Model "{model.name}" registered.'})
    return JSONResponse({"status": f'Model "{model.name}" registration scheduled.'}, status_code=202)


@router.put("/models/{model_name}")
async def scale_model(model_name: str, request: Request) -> JSONResponse:
    """``PUT /models/{name}?min_worker=&max_worker=&synchronous=``."""
    synchronous = query_flag(request, "synchronous", True)
    low, high = await _admin(request).scale(
        model_name, _count(request, "min_worker"), _count(request, "max_worker"), synchronous
    )
    status = f'Model "{model_name}" worker scaled. New Worker configuration min workers:{low} max workers:{high}'
    return JSONResponse({"status": status}, status_code=200 if synchronous else 202)


@router.delete("/models/{model_name}")
async def unregister_model(model_name: str, request: Request) -> JSONResponse:
    pool = request.app.state.pool
    if pool is not None:  # after the requests in flight are done
        await pool.unload(model_name)
    else:
        await _admin(request).unregister(model_name)
    return JSONResponse({"status": f'Model "{model_name}" unregistered'})
