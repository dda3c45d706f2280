"""A model named by a Hugging Face Hub id or an ``s3://`` prefix, while its files are fetched: in
the registry under its name, ``Loading`` in ``/ping`` and ``GET /models`` (``Failed``, with why, if the
fetch fails), then replaced by the model built on the fetched files. ``model_loading_timeout``
covers the download and the load together."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from ..config import Settings
from ..model_fetch import FetchError, is_remote
from ..model_fetch.progress import downloaded_bytes
from .handler_model import ModelLoadError
from .model_factory import build_model
from .model_sources import fetch, remote_draft
from .registry import ModelRegistry, ServedModel


async def fetched_settings(settings: Settings) -> tuple[Settings, float]:
    """``settings`` with ``option.model_id`` the fetched files' local path (and speculative decoding's
    draft model too, where a Hub id or an ``s3://`` prefix names it), and the seconds left of
    ``model_loading_timeout`` for the load."""
    timeout = float(settings.model.model_loading_timeout)
    started = time.monotonic()
    fetched = settings
    if is_remote(settings.model.model_id, settings.model_dir):
        assert settings.model.model_id is not None
        path = await asyncio.to_thread(fetch, settings.model.model_id, settings, started + timeout)
        fetched = dataclasses.replace(fetched, model=settings.model.model_copy(update={"model_id": str(path)}))
    draft = remote_draft(settings)
    if draft is not None:  # the repository's own revision: option.revision and gguf_file are the model's
        path = await asyncio.to_thread(fetch, draft, settings, started + timeout, of_model=False)
        fetched = dataclasses.replace(fetched, engine=settings.engine.with_draft(str(path)))
    left = max(1.0, timeout - (time.monotonic() - started))
    return fetched, left


def fetched_model(settings: Settings, left: float) -> ServedModel:
    """The model built on fetched files, its first start held to what the download ``left``."""
    model = build_model(settings)
    if hasattr(model, "first_load_timeout"):
        model.first_load_timeout = left
    return model


class FetchingModel:
    """A model whose files are being fetched: in the registry under its name until it is built."""

    kind = "download"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.name = settings.model_name
        self.failure: str | None = None
        self._bytes_at_start = downloaded_bytes()

    @property
    def status(self) -> str:
        return "Failed" if self.failure is not None else "Loading"

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "modelName": self.name,
            "status": self.status,
            "modelId": self.settings.model.model_id,
            "downloadedBytes": downloaded_bytes() - self._bytes_at_start,
        }
        if self.failure is not None:
            described["error"] = self.failure
        return described

    async def start(self) -> None:
        raise ModelLoadError("a model being fetched is built by build(), not started")

    async def stop(self) -> None:
        pass

    async def build(self, registry: ModelRegistry) -> ServedModel:
        """Fetch the files, build the model on them and put it in the registry in this one's place.
        Raises ModelLoadError (and stays in the registry as Failed) when either fails."""
        try:
            model = fetched_model(*await fetched_settings(self.settings))
        except (FetchError, ModelLoadError) as exc:
            self.failure = str(exc)
            registry.changed()
            raise ModelLoadError(self.failure) from None
        registry.add(model)
        return model
