"""The management API, the DJL way: list and describe models."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ...errors import BadRequest

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
