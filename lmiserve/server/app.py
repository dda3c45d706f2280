"""The FastAPI application: routes, error mapping and middleware."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI

from .. import __version__
from ..config import Settings
from ..serving import ModelAdmin, ModelPool, ModelRegistry, ResponseStore
from . import errors
from .api_processes import MainProcessMiddleware
from .data_plane import DataPlane
from .drain import Drain, DrainMiddleware
from .forward import Forward, ProcessHeader
from .kserve_grpc.server import start_grpc, stop_grpc
from .metrics import ServerMetrics
from .middleware import BodyLimitMiddleware, MetricsMiddleware, RequestIdMiddleware
from .routes import adapters, databricks, inference, kserve, management, openai, ping, responses, tgi, tokenize
from .routes import metrics as metrics_routes
from .security import ApiKeys, SecurityMiddleware, management_reach

StartupHook = Callable[[], Awaitable[None]]


def create_app(
    registry: ModelRegistry,
    settings: Settings,
    on_startup: StartupHook | None = None,
    api_processes: Any = None,
    link: Any = None,
    process_index: int = 0,
) -> FastAPI:
    """Build the app. ``on_startup`` runs in the background once the server listens, so
    that ``/ping`` answers 503 while models load. With several API processes, the main one
    passes its :class:`~.api_processes.ApiProcesses`, another its :class:`~.forward.MainLink`
    and index."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        grpc_server = await start_grpc(registry, settings, app.state.metrics)
        if api_processes is not None:
            await api_processes.start()
        task = asyncio.create_task(on_startup()) if on_startup else None
        try:
            yield
        finally:
            if api_processes is not None:
                await api_processes.close()
            if link is not None:
                await link.models.close()
                await link.close()
            await stop_grpc(grpc_server)
            if task is not None and not task.done():
                task.cancel()
            await app.state.admin.close()
            if app.state.pool is not None:
                await app.state.pool.close()
            await asyncio.gather(*(m.stop() for m in list(registry.models.values())), return_exceptions=True)

    app = FastAPI(title="lmiserve", version=__version__, lifespan=lifespan)
    app.state.registry = registry
    app.state.settings = settings
    app.state.admin = ModelAdmin(registry, settings)
    app.state.metrics = ServerMetrics(registry)
    app.state.plane = DataPlane(registry, app.state.metrics)
    multi = settings.server.multi_model and link is None  # the main process owns the pool
    app.state.pool = ModelPool(registry, settings, app.state.metrics.registry) if multi else None
    app.state.drain = Drain()
    app.state.api_processes = api_processes
    app.state.responses = ResponseStore(settings.server.responses_store_size, settings.server.responses_store_ttl)
    errors.install(app)
    app.include_router(ping.router)
    app.include_router(inference.router)
    app.include_router(management.router)
    app.include_router(adapters.router)
    app.include_router(tgi.router)
    app.include_router(tokenize.router)
    app.include_router(openai.router)
    app.include_router(responses.router)
    app.include_router(kserve.router)
    app.include_router(metrics_routes.router)
    app.include_router(databricks.router)
    app.add_middleware(BodyLimitMiddleware, limit=settings.server.max_request_size)
    app.add_middleware(
        SecurityMiddleware,
        keys=ApiKeys.from_settings(settings),
        management=management_reach(settings),
        log_bodies=settings.server.log_request_bodies,
    )
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    if link is not None:  # another API process: inference here, the rest to the main process
        app.add_middleware(Forward, link=link)
    app.add_middleware(DrainMiddleware, drain=app.state.drain)  # refusals cost nothing
    if api_processes is not None:
        app.add_middleware(MainProcessMiddleware, registry=registry)
    elif link is not None:
        app.add_middleware(ProcessHeader, index=process_index)
    return app
