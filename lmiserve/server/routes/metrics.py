"""``GET /metrics`` and ``GET /server/metrics``: Prometheus text exposition of the server's metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..metrics import CONTENT_TYPE

router = APIRouter()


_TEXT = {200: {"description": "Prometheus text exposition format", "content": {"text/plain": {}}}}


@router.get("/metrics", response_class=Response, responses=_TEXT)
@router.get("/server/metrics", response_class=Response, responses=_TEXT)
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.expose(), media_type=CONTENT_TYPE)
