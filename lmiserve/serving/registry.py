"""The models this server answers for, by name."""

from __future__ import annotations

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

    def add(self, model: ServedModel) -> None:
        self.models[model.name] = model

    def remove(self, name: str) -> ServedModel:
        return self.models.pop(name)

    def get(self, name: str) -> ServedModel:
        try:
            return self.models[name]
        except KeyError:
            known = ", ".join(sorted(self.models)) or "none"
            raise NotFound(f"model {name!r} is not loaded (loaded: {known})") from None

    def resolve(self, name: str | None) -> ServedModel:
        """The named model, or the only one when no name is given."""
        if name:
            return self.get(name)
        if len(self.models) == 1:
            return next(iter(self.models.values()))
        if not self.models:
            raise NotFound("no model is loaded")
        names = ", ".join(sorted(self.models))
        raise BadRequest(f"several models are loaded ({names}); name one with the model_name query parameter or header")

    def adapter_owner(self, name: str) -> ServedModel | None:
        """The model that has a LoRA adapter called ``name`` registered, if one has."""
        for model in self.models.values():
            adapters = getattr(model, "adapters", None)
            if adapters is not None and name in adapters.entries:
                return model
        return None

    def ping(self) -> tuple[bool, dict[str, str]]:
        states = {name: model.status for name, model in self.models.items()}
        healthy = bool(states) and all(s == "Healthy" for s in states.values())
        return healthy, states
