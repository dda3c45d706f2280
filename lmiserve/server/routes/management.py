"""The management API, the DJL way: list, describe, register, scale and unregister models."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ...errors import BadRequest
from ..model_admin import ModelAdmin

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


def _flag(request: Request, name: str, default: bool) -> bool:
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


@router.post("/models")
async def register_model(request: Request) -> JSONResponse:
    """``POST /models?url=...&model_name=...&min_worker=...&synchronous=true``."""
    url = request.query_params.get("url")
    if not url:
        raise BadRequest("url is required: the model directory to load")
    synchronous = _flag(request, "synchronous", True)
    model = await _admin(request).register(url, dict(request.query_params), synchronous)
    if synchronous:
        return JSONResponse({"status": f'Model "{model.name}" registered.'})
    return JSONResponse({"status": f'Model "{model.name}" registration scheduled.'}, status_code=202)


@router.put("/models/{model_name}")
async def scale_model(model_name: str, request: Request) -> JSONResponse:
    """``PUT /models/{name}?min_worker=&max_worker=&synchronous=``."""
    synchronous = _flag(request, "synchronous", True)
    low, high = await _admin(request).scale(
        model_name, _count(request, "min_worker"), _count(request, "max_worker"), synchronous
    )
    status = f'Model "{model_name}" worker scaled. New Worker configuration min workers:{low} max workers:{high}'
    return JSONResponse({"status": status}, status_code=200 if synchronous else 202)


@router.delete("/models/{model_name}")
async def unregister_model(model_name: str, request: Request) -> JSONResponse:
    await _admin(request).unregister(model_name)
    return JSONResponse({"status": f'Model "{model_name}" unregistered'})
