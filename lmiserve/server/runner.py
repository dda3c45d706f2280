"""Starting the HTTP server, loading the model behind it, and stopping on failure."""

from __future__ import annotations

import importlib.util
import logging
import time

import uvicorn

from .. import __version__
from ..config import Settings
from .app import create_app
from .handler_model import ModelLoadError
from .model_factory import build_model
from .registry import ModelRegistry

log = logging.getLogger("lmiserve")

GRACEFUL_SHUTDOWN_S = 20


def run(settings: Settings) -> int:
    """Serve until stopped. Returns the process exit status (1 when the model failed to load)."""
    for warning in settings.warnings:
        log.warning(warning)
    try:
        model = build_model(settings)
    except ModelLoadError as exc:
        log.error("cannot start model %s: %s", settings.model_name, exc)
        return 1
    registry = ModelRegistry()
    registry.add(model)
    failures: list[str] = []
    server: uvicorn.Server | None = None

    async def load_models() -> None:
        started = time.monotonic()
        log.info("loading model %s from %s", model.name, settings.model_dir)
        try:
            await model.start()
        except ModelLoadError as exc:
            failures.append(str(exc))
            log.error("model %s failed to load; stopping the server:\n%s", model.name, exc)
            if server is not None:
                server.should_exit = True
            return
        log.info("model %s ready in %.1f s", model.name, time.monotonic() - started)

    app = create_app(registry, settings, on_startup=load_models)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.server.log_level,
        access_log=settings.server.log_level == "debug",
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        log_config=None,
    )
    server = uvicorn.Server(config)
    log.info(
        "lmiserve %s: model %s on http://%s:%s", __version__, model.name, settings.server.host, settings.server.port
    )
    server.run()
    return 1 if failures else 0
