"""Starting the HTTP server, loading the model behind it, and stopping on failure."""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable

import uvicorn

from .. import __version__
from ..config import ConfigError, Settings
from ..serving import (
    MIB,
    FetchingModel,
    ModelLoadError,
    ModelRegistry,
    ServedModel,
    build_model,
    memory_budget,
    needs_fetch,
)
from .api_processes import ApiProcesses
from .app import StartupHook, create_app
from .drain import DrainingServer
from .tls import ServerTls, TlsError

log = logging.getLogger("lmiserve")

# what uvicorn waits for the connections after the drain, before it cancels what still runs
CONNECTION_CLOSE_S = 2


def run(settings: Settings, argv: list[str] | None = None) -> int:
    """Serve until stopped. Returns the process exit status: 0 after a stop signal (the requests in
    flight drained first), 1 when the model failed to load. ``argv``: the serve command's
    arguments, which the other API processes (``api_processes``) are started with."""
    began = time.monotonic()
    for warning in settings.warnings:
        log.warning(warning)
    registry = ModelRegistry()
    try:
        tls = ServerTls.from_settings(settings)
    except TlsError as exc:
        log.error("cannot start: %s", exc)
        return 2
    count = settings.server.api_process_count(os.cpu_count())
    if tls is not None and count > 1:  # the processes forward to each other over plain sockets
        log.warning("TLS is on: one API process serves the port (api_processes %d asked for)", count)
        count = 1
    processes = ApiProcesses(settings, count, argv or []) if count > 1 else None
    if settings.server.multi_model:  # no model at start-up: each loads on demand
        root, budget = settings.server.multi_model_root, memory_budget(settings) // MIB
        log.info("multi-model mode: the models under %s load on demand, within %d MiB", root, budget)
        return _serve(settings, registry, None, lambda: False, f"multi-model, models under {root}", processes=processes)
    model: ServedModel
    try:
        # a Hub id or an s3:// prefix is fetched once the server is up (/ping says Loading meanwhile)
        model = FetchingModel(settings) if needs_fetch(settings) else build_model(settings)
    except ModelLoadError as exc:
        log.error("cannot start model %s: %s", settings.model_name, exc)
        if processes is not None:
            processes.remove_directory()
        return 1
    registry.add(model)
    failures: list[str] = []
    servers: list[DrainingServer] = []

    async def load_models() -> None:
        nonlocal model
        started = time.monotonic()
        try:
            if isinstance(model, FetchingModel):
                log.info("fetching model %s: option.model_id=%s", model.name, settings.model.model_id)
                model = await model.build(registry)
            log.info("loading model %s: %s", model.name, _what(settings, model))
            await model.start()
        except ModelLoadError as exc:
            failures.append(str(exc))
            log.error("model %s failed to load; stopping the server:\n%s", model.name, exc)
            for server in servers:
                server.should_exit = True
            return
        log.info(
            "model %s ready in %.1f s (%.1f s after start-up began): %s",
            model.name,
            time.monotonic() - started,
            time.monotonic() - began,
            _loaded(model),
        )

    return _serve(settings, registry, load_models, lambda: bool(failures), f"model {model.name}", servers, processes)


def _serve(
    settings: Settings,
    registry: ModelRegistry,
    on_startup: StartupHook | None,
    failed: Callable[[], bool],
    what: str,
    servers: list[DrainingServer] | None = None,
    processes: ApiProcesses | None = None,
) -> int:
    try:
        app = create_app(registry, settings, on_startup=on_startup, api_processes=processes)
    except ConfigError as exc:  # an api_keys_file that cannot be read
        log.error("cannot start: %s", exc)
        return 2
    server = DrainingServer(uvicorn_config(app, settings), app.state.drain, settings.server.drain_timeout, processes)
    if servers is not None:
        servers.append(server)
    scheme = "https" if settings.server.ssl_certfile else "http"
    log.info("lmiserve %s: %s on %s://%s:%s", __version__, what, scheme, settings.server.host, settings.server.port)
    if processes is None:
        server.run()
    else:
        try:
            sockets = processes.sockets()
        except OSError as exc:
            log.error("cannot listen on %s:%s: %s", settings.server.host, settings.server.port, exc)
            processes.remove_directory()
            return 1
        log.info("%d API processes share the port", processes.count)
        processes.follow(registry)
        server.run(sockets=sockets)
    log.info("server stopped")
    return 1 if failed() else 0


def uvicorn_config(app, settings: Settings) -> uvicorn.Config:  # type: ignore[no-untyped-def]
    tls = ServerTls.from_settings(settings)
    return uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.server.log_level,
        access_log=settings.server.log_level == "debug",
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        timeout_graceful_shutdown=CONNECTION_CLOSE_S,
        log_config=None,
        **(tls.uvicorn_options() if tls is not None else {}),
    )


def _what(settings: Settings, model) -> str:  # type: ignore[no-untyped-def]
    """What is about to be loaded, in one line."""
    cfg = settings.model
    source = cfg.model_id or "the model directory (else the embedded default model)"
    parts = [f"option.model_id={source}", f"model directory {settings.model_dir}"]
    if settings.properties_file is not None:
        parts.append(f"properties {settings.properties_file}")
    parts.append(f"option.rolling_batch={cfg.rolling_batch}")
    entry = getattr(model, "entry_point", None)
    parts.append(f"handler {entry}" if entry else f"{getattr(model, 'backend', model.kind)} engine")
    return ", ".join(parts)


def _loaded(model) -> str:  # type: ignore[no-untyped-def]
    """What was loaded, in one line: the resolved weights and how they run."""
    path = getattr(model, "path", None)
    described = model.describe()
    engine = described.get("engine") or {}
    parts = [f"weights {path}"] if path else []
    keys = ("architecture", "dtype", "device", "tensor_parallel_degree", "max_model_len", "kv_tokens")
    parts += [f"{key} {engine[key]}" for key in keys if key in engine]
    workers = described.get("workers")
    if workers is not None:
        parts.append(f"{len(workers)} worker(s) running {getattr(model, 'entry_point', '?')}")
    return ", ".join(parts) or model.kind
