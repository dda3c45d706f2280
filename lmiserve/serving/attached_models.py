"""The models of an API process beside the main one: engine models attached to the main one's engines.

Such a process tokenizes, detokenizes and formats for itself, and talks to each engine over the
engine's own socket (:class:`~lmiserve.rolling_batch.process.attached_client.AttachedEngineClient`); it
starts no engine and loads no weights. :func:`apply` brings its registry in line with the main
process's description (:func:`.shared_state.describe_models`): models attached, adapters known,
models gone detached.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from ..config import Settings
from ..generation.tokenizer import load_tokenizer
from ..handlers.custom_formatters import load_custom_formatters
from ..rolling_batch.process.attached_client import AttachedEngineClient
from .adapters import AdapterInfo
from .engine_model import EngineModel
from .handler_model import ModelLoadError
from .model_admin import registration_settings
from .registry import ModelRegistry

log = logging.getLogger("lmiserve.model")


class AttachedEngineModel(EngineModel):
    metrics_snapshot = None
    """The main process reports the engine's state; this one would count it twice."""
    replays_here = False
    """The main process restarts the engine; a request here ends with its crash."""

    def __init__(self, settings: Settings, entry: dict[str, Any], index: int):
        super().__init__(settings, entry.get("backend", "lmi"))
        self.socket = str(entry["socket"])
        self.id_prefix = f"p{index}-"
        self.path = Path(entry["path"])
        self.vocab_size = entry.get("vocab_size")
        self.engine_info = dict(entry["info"])
        self.max_model_len = int(self.engine_info["max_model_len"])
        self.registration = entry.get("registration")
        self.set_adapters(entry.get("adapters") or [])

    def set_adapters(self, adapters: list[dict[str, Any]]) -> None:
        self.adapters.entries = {a["name"]: AdapterInfo(**a) for a in adapters}

    async def start(self) -> None:
        try:
            self.custom_formatters = load_custom_formatters(
                self.settings.model_dir, self.settings.model.output_formatter
            )
            self.tokenizer = await asyncio.to_thread(load_tokenizer, self.path, self.settings.model.trust_remote_code)
            client = AttachedEngineClient(self.socket, self.engine_info)
            await client.start()
        except Exception as exc:  # noqa: BLE001
            self.failure = str(exc)
            raise ModelLoadError(self.failure) from None
        client.on_exit = self._detached
        client.on_deltas = self._decode_step  # each step's text decoded at once, as in the main process
        self.client = client
        self._ever_ready = True

    def _detached(self, client: Any, reason: str) -> None:
        # the main process restarts the engine; its next description names the new socket
        log.info("model %s: the engine's connection closed (%s)", self.name, reason)

    async def stop(self) -> None:
        self._closing = True
        if self.client is not None:
            await self.client.stop()


def _settings_for(entry: dict[str, Any], settings: Settings) -> Settings | None:
    """The settings the main process built the model with: the server's own for the model it
    started with, else those its registration named."""
    registration = entry.get("registration")
    if registration is None:
        return settings if entry["name"] == settings.model_name else None
    try:
        fetched = registration.get("fetched")
        return registration_settings(
            registration["url"], registration["params"], settings, Path(fetched) if fetched else None
        )
    except Exception:  # noqa: BLE001 - served by the main process instead
        return None


class AttachedModels:
    """Keeps ``registry`` in line with the main process's models; :attr:`complete` when every
    model there is attached here (then this process answers inference requests itself)."""

    def __init__(self, registry: ModelRegistry, settings: Settings, index: int):
        self.registry = registry
        self.settings = settings
        self.index = index
        self.version = -1
        self.complete = False
        self._lock = asyncio.Lock()
        self._attaching: dict[str, asyncio.Task[None]] = {}

    async def apply(self, state: dict[str, Any]) -> None:
        async with self._lock:
            wanted = {e["name"]: e for e in state["models"] if e.get("shared")}
            for name, model in list(self.registry.models.items()):
                entry = wanted.get(name)
                attached = model.client is not None and model.client.alive  # type: ignore[attr-defined]
                if entry is None or entry["socket"] != model.socket or not attached:  # type: ignore[attr-defined]
                    self.registry.models.pop(name, None)
                    await model.stop()
                elif isinstance(model, AttachedEngineModel):
                    model.set_adapters(entry.get("adapters") or [])
            for name, entry in wanted.items():
                if name not in self.registry.models and name not in self._attaching:
                    self._attach_later(entry)
            self.version = int(state["version"])
            names = {e["name"] for e in state["models"]}
            self.complete = (
                not self.settings.server.multi_model
                and bool(names)
                and names == set(wanted)
                and all(
                    name in self.registry.models and self.registry.models[name].status == "Healthy" for name in names
                )
            )

    def _attach_later(self, entry: dict[str, Any]) -> None:
        settings = _settings_for(entry, self.settings)
        if settings is None:
            return
        model = AttachedEngineModel(settings, entry, self.index)

        async def attach() -> None:
            try:
                await model.start()
            except ModelLoadError as exc:
                log.warning("model %s: not attached to its engine (%s); the main process serves it", model.name, exc)
                return
            finally:
                self._attaching.pop(model.name, None)
            self.registry.models[model.name] = model
            self.version = -1  # look again: the main process may have moved on meanwhile
            log.info("model %s: attached to its engine at %s", model.name, model.socket)

        self._attaching[model.name] = asyncio.create_task(attach(), name=f"attach-{model.name}")

    async def close(self) -> None:
        for task in list(self._attaching.values()):
            task.cancel()
        await asyncio.gather(*self._attaching.values(), return_exceptions=True)
        await asyncio.gather(*(m.stop() for m in list(self.registry.models.values())), return_exceptions=True)
        self.registry.models.clear()
