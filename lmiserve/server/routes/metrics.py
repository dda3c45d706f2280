"""``GET /metrics`` and ``GET /server/metrics``: Prometheus text exposition of the server's metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..metrics import CONTENT_TYPE
from ..metrics_merge import merge_expositions

router = APIRouter()


_TEXT = {200: {"description": "Prometheus text exposition format", "content": {"text/plain": {}}}}


@router.get("/metrics", response_class=Response, responses=_TEXT)
@router.get("/server/metrics", response_class=Response, responses=_TEXT)
async def metrics(request: Request) -> Response:
    own = request.app.state.metrics.expose()
    processes = getattr(request.app.state, "api_processes", None)
    if processes is None:
        return Response(own, media_type=CONTENT_TYPE)
    # several API processes: what each counted, added up
    return Response(merge_expositions([own, *await processes.collect_metrics()]), media_type=CONTENT_TYPE)
