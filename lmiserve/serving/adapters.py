"""The LoRA adapters of one engine model, as the management API and requests see them.

DJL's Adapters Management API in substance: register (``name``, ``src``, ``preload``, ``pin``),
update, describe, list and unregister; adapter directories under ``<model_dir>/adapters/`` are
registered when the model starts, and every registered adapter again when its engine restarts.
``src`` must lie under ``model_roots``, as for model registration. The engine does the loading;
this book keeps what was asked, in registration order.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Settings
from ..errors import BadRequest, Conflict, Forbidden, InsufficientMemory, LmiServeError, NotFound, ValidationFailed
from ..model_fetch import FetchError, is_remote
from .model_paths import model_roots
from .model_sources import fetch

log = logging.getLogger("lmiserve.adapters")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$")
"""What MindIE's ``adapter_id`` may hold (letters, digits, ``.``, ``_``, ``-`` and ``/``, at most 256:
a Hub-style ``org/name`` too), beginning with a letter or digit as DJL's names do."""
ADAPTERS_DIR = "adapters"


@dataclass
class AdapterInfo:
    name: str
    src: str
    """As the client gave it (DJL answers it back as given)."""
    path: str
    """The directory, resolved: what the engine reads."""
    preload: bool = True
    pin: bool = False

    def describe(self) -> dict[str, Any]:
        """DJL's DescribeAdapterResponse: name, src, preload, pin."""
        return {"name": self.name, "src": self.src, "preload": self.preload, "pin": self.pin}


_REFUSALS: dict[str, type[LmiServeError]] = {
    "not_found": NotFound,
    "conflict": Conflict,
    "no_capacity": InsufficientMemory,
    "disabled": BadRequest,
    "unknown_action": BadRequest,
}
"""The error for each kind of refusal the engine answers an adapter command with; the others
("invalid" options, an "unloadable" adapter) are DJL's 424."""


def _raise_for(result: Any) -> None:
    """An engine's AdapterResult as the error the management API answers."""
    if result.kind is None:
        return
    refusal = _REFUSALS.get(result.kind)
    if refusal is not None:
        raise refusal(result.error or "")
    raise LmiServeError(result.error or "the adapter could not be loaded", status=424)


class ModelAdapters:
    def __init__(self, settings: Settings, model_name: str, backend: str = "lmi"):
        self.settings = settings
        self.backend = backend
        self.model_name = model_name
        self.entries: dict[str, AdapterInfo] = {}
        self._lock = asyncio.Lock()
        self.on_change: Callable[[], None] = lambda: None
        """Called after an adapter is registered, updated or unregistered."""

    @property
    def enabled(self) -> bool:
        return self.settings.engine.enable_lora and self.backend != "vllm"

    def check_enabled(self) -> None:
        if not self.enabled:
            if self.settings.engine.enable_lora:  # on vLLM
                raise BadRequest(
                    "LoRA adapters are served by lmiserve's engine (option.rolling_batch=lmi or npu), not by vllm"
                )
            raise BadRequest("LoRA is not enabled.")

    def get(self, name: str) -> AdapterInfo:
        self.check_enabled()
        info = self.entries.get(name)
        if info is None:
            raise NotFound(f"The adapter {name} was not found")
        return info

    def _path(self, src: str) -> Path:
        path = Path(src).expanduser()
        if not path.is_absolute():
            path = self.settings.model_dir / path
        resolved = path.resolve()
        roots = model_roots(self.settings)
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            raise Forbidden(f"src {src!r}: adapters can only be loaded from the model_roots directories")
        return resolved

    async def _located(self, src: str) -> Path:
        """The adapter's directory: a local one under the model roots, or a Hub id's or an
        ``s3://`` prefix's files, fetched."""
        if not is_remote(src, self.settings.model_dir):
            return self._path(src)
        try:
            return await asyncio.to_thread(fetch, src, self.settings, of_model=False)
        except FetchError as exc:
            raise BadRequest(f"src {src!r}: {exc}") from None

    # --- management -----------------------------------------------------------------------
    async def register(self, client: Any, name: str, src: str, preload: bool = True, pin: bool = False) -> AdapterInfo:
        self.check_enabled()
        if not NAME.match(name or ""):
            raise BadRequest(
                f"adapter name {name!r}: letters, digits, '.', '_', '-' and '/', at most 256, first a letter or digit"
            )
        if name == "None":
            raise BadRequest("adapter name 'None' names the base model (MindIE's adapter_id)")
        if not src:
            raise BadRequest("src is required: the adapter's directory")
        path = await self._located(src)
        async with self._lock:
            if name in self.entries:
                raise Conflict(f"Adapter {name} is already registered")
            _raise_for(await client.adapter_command("register", name, str(path), preload, pin))
            info = AdapterInfo(name, src, str(path), preload, pin)
            self.entries[name] = info
        self.on_change()
        log.info("model %s: adapter %s registered from %s", self.model_name, name, path)
        return info

    async def update(self, client: Any, name: str, preload: bool | None, pin: bool | None) -> AdapterInfo:
        async with self._lock:
            info = self.get(name)
            _raise_for(await client.adapter_command("update", name, "", preload, pin))
            if preload is not None:
                info.preload = preload
            if pin is not None:
                info.pin = pin
        self.on_change()
        return info

    async def unregister(self, client: Any, name: str) -> None:
        async with self._lock:
            self.get(name)
            _raise_for(await client.adapter_command("unregister", name))
            del self.entries[name]
        self.on_change()
        log.info("model %s: adapter %s unregistered", self.model_name, name)

    # --- start and restart ----------------------------------------------------------------
    def found_in(self, *directories: Path | None) -> list[tuple[str, Path]]:
        """``adapters/<name>/`` directories next to the model (its directory, then the weights')."""
        found: dict[str, Path] = {}
        for directory in directories:
            folder = None if directory is None else Path(directory) / ADAPTERS_DIR
            if folder is None or not folder.is_dir():
                continue
            for child in sorted(folder.iterdir()):
                if child.is_dir() and child.name not in found:
                    found[child.name] = child
        return list(found.items())

    async def register_found(self, client: Any, *directories: Path | None) -> None:
        """Register the adapters found next to the model; one that fails is logged and left out."""
        if not self.enabled:
            return
        for name, path in self.found_in(*directories):
            try:
                await self.register(client, name, str(path))
            except LmiServeError as exc:
                log.error("model %s: adapter %s in %s was not registered: %s", self.model_name, name, path, exc.detail)

    async def replay(self, client: Any) -> None:
        """A restarted engine knows no adapter: register them all again."""
        for info in list(self.entries.values()):
            result = await client.adapter_command("register", info.name, info.path, info.preload, info.pin)
            if result.kind is not None:
                log.error(
                    "model %s: adapter %s could not be registered again: %s", self.model_name, info.name, result.error
                )
                self.entries.pop(info.name, None)

    # --- requests ---------------------------------------------------------------------------
    def check_request(self, name: str | None) -> str:
        """The adapter a request names, checked: "" for the base model."""
        if not name:
            return ""
        if name not in self.entries:
            raise ValidationFailed(f"Adapter {name} is not registered")
        return name
