"""Loading, scaling and unloading models while the server runs (the management API's work).

A model is registered from a ``url``: a local model directory (with or without
``serving.properties``), a ``file://`` URL of one, or a model file (``.gguf``) whose directory
becomes the model directory, under one of the ``model_roots`` directories; or a Hugging Face Hub
id or an ``s3://`` prefix, fetched first (its files are then the model directory). Query parameters override the directory's ``serving.properties``
the way command-line flags do; the server's own settings (log level, ports) stay the server's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..config import ConfigError, Settings, load_settings
from ..errors import BadRequest, Conflict, LmiServeError
from ..model_fetch import FetchError, is_remote
from .engine_model import EngineModel
from .fetching_model import fetched_model, fetched_settings
from .handler_model import HandlerModel, ModelLoadError
from .model_factory import build_model
from .model_paths import check_model_path, model_roots
from .model_sources import fetch, needs_fetch
from .registry import ModelRegistry, ServedModel

log = logging.getLogger("lmiserve.management")

# query parameter -> setting key (DJL's names)
REGISTER_PARAMETERS = {
    "model_name": "model_name",
    "engine": "engine",
    "batch_size": "batch_size",
    "max_batch_delay": "max_batch_delay",
    "max_idle_time": "max_idle_time",
    "min_worker": "minWorkers",
    "max_worker": "maxWorkers",
    "job_queue_size": "job_queue_size",
}


def model_location(url: str, roots: list[Path]) -> tuple[Path, str | None]:
    """(model directory, model file or None) for a registration ``url``, which must lie under one
    of ``roots`` once ``..`` and symlinks are resolved."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        path = Path(unquote(parsed.path))
    elif parsed.scheme in ("", "/") or len(parsed.scheme) == 1:  # a plain path (or a Windows drive)
        path = Path(url)
    else:
        raise BadRequest(f"url {url!r}: only local model directories (a path or file://) can be loaded")
    path = check_model_path(path, roots, url)
    if path.is_dir():
        return path, None
    if path.is_file():
        return path.parent, str(path)
    raise BadRequest(f"url {url!r}: no such model directory or file")


def registration_settings(url: str, params: dict[str, str], server: Settings, fetched: Path | None = None) -> Settings:
    """The settings of a model registered from ``url`` (``fetched``: where a Hub id's or an
    ``s3://`` prefix's files were fetched to, which is its model directory)."""
    if fetched is not None:
        directory, model_file = (fetched, None) if fetched.is_dir() else (fetched.parent, str(fetched))
    else:
        directory, model_file = model_location(url, model_roots(server))
    cli: dict[str, str] = {}
    for name, key in REGISTER_PARAMETERS.items():
        if params.get(name) not in (None, ""):
            cli[key] = params[name]
    if model_file is not None:
        cli["option.model_id"] = model_file
    if fetched is not None and "model_name" not in cli:  # named as the URL's last part, not the download's
        cli["model_name"] = re.sub(r"[^A-Za-z0-9_.-]", "_", url.rstrip("/").rsplit("/", 1)[-1].split(":")[0])
    try:
        settings = load_settings(directory, env={}, cli=cli)
    except ConfigError as exc:
        raise BadRequest(str(exc)) from None
    return dataclasses.replace(settings, server=server.server)


class ModelAdmin:
    """Registers, scales and unregisters the models of one registry."""

    def __init__(self, registry: ModelRegistry, server: Settings):
        self.registry = registry
        self.server = server
        self._loading: set[asyncio.Task[None]] = set()

    async def register(self, url: str, params: dict[str, str], synchronous: bool = True) -> ServedModel:
        fetched = None
        if is_remote(url):  # a Hub id or an s3:// prefix: its files, with serving.properties if it has one
            try:
                fetched = await asyncio.to_thread(fetch, url, self.server, of_model=False)
            except FetchError as exc:
                raise BadRequest(f"url {url!r}: {exc}") from None
        settings = registration_settings(url, params, self.server, fetched)
        left = None
        if needs_fetch(settings):  # its serving.properties names a Hub id or an s3:// prefix
            try:
                settings, left = await fetched_settings(settings)
            except FetchError as exc:
                raise BadRequest(f"model {settings.model_name!r}: {exc}") from None
        if settings.model_name in self.registry.models:
            raise Conflict(f"model {settings.model_name!r} is already registered")
        try:
            model = build_model(settings) if left is None else fetched_model(settings, left)
        except ModelLoadError as exc:
            raise BadRequest(f"model {settings.model_name!r} cannot be served: {exc}") from None
        model.registration = {"url": url, "params": dict(params)}  # type: ignore[attr-defined]
        if fetched is not None:
            model.registration["fetched"] = str(fetched)  # type: ignore[attr-defined]
        self.registry.add(model)
        log.info("registering model %s from %s", model.name, settings.model_dir)
        if synchronous:
            await self._load(model, keep_failed=False)
        else:
            task = asyncio.create_task(self._load(model, keep_failed=True))
            self._loading.add(task)
            task.add_done_callback(self._loading.discard)
        return model

    async def _load(self, model: ServedModel, keep_failed: bool) -> None:
        try:
            await model.start()
        except ModelLoadError as exc:
            log.error("model %s failed to load: %s", model.name, exc)
            if not keep_failed:  # a synchronous caller hears of it; an asynchronous one sees "Failed"
                if self.registry.models.get(model.name) is model:
                    self.registry.remove(model.name)
                raise LmiServeError(f"model {model.name!r} failed to load: {exc}", status=500) from None
            return
        log.info("model %s registered", model.name)

    async def scale(
        self, name: str, min_workers: int | None, max_workers: int | None, synchronous: bool
    ) -> tuple[int, int]:
        model = self.registry.get(name)
        if isinstance(model, EngineModel):
            if (min_workers or 1) != 1 or (max_workers or 1) != 1:
                raise BadRequest(
                    f"model {name} runs one continuous-batching engine that serves every request; it has no worker pool to scale"
                )
            return 1, 1
        if not isinstance(model, HandlerModel):
            raise BadRequest(f"model {name} cannot be scaled")
        low = min_workers if min_workers is not None else model.config.min_workers
        high = max_workers if max_workers is not None else max(low, model.config.max_workers)
        if low < 1 or high < low:
            raise BadRequest(f"min_worker ({low}) must be at least 1 and max_worker ({high}) at least min_worker")
        await model.scale(low, high, wait=synchronous)
        return low, high

    async def unregister(self, name: str) -> None:
        model = self.registry.get(name)
        self.registry.remove(name)
        log.info("unregistering model %s", name)
        await model.stop()

    async def close(self) -> None:
        for task in list(self._loading):
            task.cancel()
        await asyncio.gather(*self._loading, return_exceptions=True)
