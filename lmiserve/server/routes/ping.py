"""``GET /ping``: 200 when every model is ready, 503 otherwise; the body maps models to states."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

router = APIRouter()


@router.get("/ping")
async def ping(request: Request) -> JSONResponse:
    healthy, states = request.app.state.registry.ping()
    return JSONResponse(states, status_code=200 if healthy else 503)
