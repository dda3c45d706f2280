"""``GET /ping``: 200 when every model is ready, 503 otherwise; the body maps models to states.
In multi-model mode 200 whenever the server answers: models load on demand."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

router = APIRouter()


@router.get("/ping")
async def ping(request: Request) -> JSONResponse:
    healthy, states = request.app.state.registry.ping()
    if request.app.state.pool is not None:  # multi-model mode: ready for load calls with no model loaded
        healthy = True
    return JSONResponse(states, status_code=200 if healthy else 503)
