"""The models this server answers for, by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..errors import BadRequest, NotFound


class ServedModel(Protocol):
    name: str
    kind: str

    @property
    def status(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class ModelRegistry:
    def __init__(self) -> None:
        self.models: dict[str, ServedModel] = {}
        self.version = 0
        """Counts the changes: a model added or removed, an engine (re)started, an adapter
        registered or unregistered (models with an ``on_change`` attribute report theirs)."""
        self.listeners: list[Callable[[int], None]] = []

    def changed(self) -> None:
        self.version += 1
        for listener in self.listeners:
            listener(self.version)

    def add(self, model: ServedModel) -> None:
        self.models[model.name] = model
        if hasattr(model, "on_change"):
            model.on_change = self.changed  # type: ignore[attr-defined]
        self.changed()

    def remove(self, name: str) -> ServedModel:
        model = self.models.pop(name)
        self.changed()
        return model

    def get(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise self._not_loaded(name)
        return model

    def _not_loaded(self, name: str) -> NotFound:
        known = ", ".join(sorted(self.models)) or "none"
        return NotFound(f"model {name!r} is not loaded (loaded: {known})")

    def resolve(self, name: str | None) -> tuple[ServedModel, str | None]:
        """The model ``name`` names and no adapter; or, where ``name`` is a LoRA adapter's, the
        model that has it and the adapter (as vLLM serves adapters under their own names); or,
        when no name is given, the only model."""
        if name:
            model = self.models.get(name)
            if model is not None:
                return model, None
            for model in self.models.values():
                adapters = getattr(model, "adapters", None)
                if adapters is not None and name in adapters.entries:
                    return model, name
            raise self._not_loaded(name)
        if len(self.models) == 1:
            return next(iter(self.models.values())), None
        if not self.models:
            raise NotFound("no model is loaded")
        names = ", ".join(sorted(self.models))
        raise BadRequest(f"several models are loaded ({names}); name one with the model_name query parameter or header")

    def model(self, name: str | None) -> ServedModel:
        """What :meth:`resolve` finds, where a model must be named: an adapter's name is not one."""
        model, adapter = self.resolve(name)
        if adapter is not None:
            raise self._not_loaded(adapter)
        return model

    def ping(self) -> tuple[bool, dict[str, str]]:
        states = {name: model.status for name, model in self.models.items()}
        healthy = bool(states) and all(s == "Healthy" for s in states.values())
        return healthy, states
