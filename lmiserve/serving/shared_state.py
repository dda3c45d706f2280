"""What the API processes beside the main one know of its models.

The main API process owns the registry. It publishes the registry's version in a small shared
file (:class:`VersionFile`, eight bytes mapped into memory: one read per request tells another
process whether anything changed) and, when asked, a description of its models
(:func:`describe_models`): for each engine model that other processes may serve themselves, the
engine's socket, the weights, the tokenizer's settings and the adapters. :mod:`.attached_models`
applies such a description in the other processes.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

from .engine_model import EngineModel
from .registry import ModelRegistry

_VERSION = struct.Struct("<Q")


class VersionFile:
    """A counter in a file mapped into memory by every API process."""

    def __init__(self, path: str, create: bool = False):
        if create:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, bytes(_VERSION.size))
        else:
            fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, _VERSION.size)
        finally:
            os.close(fd)

    def read(self) -> int:
        return _VERSION.unpack_from(self._map, 0)[0]

    def write(self, version: int) -> None:
        _VERSION.pack_into(self._map, 0, version)

    def close(self) -> None:
        self._map.close()


def shareable(model: Any) -> bool:
    """An engine model whose engine accepts other API processes, and is running."""
    client = getattr(model, "client", None)
    init = getattr(client, "init", None)
    return (
        isinstance(model, EngineModel)
        and bool(getattr(init, "listen_path", ""))
        and client.alive
        and model.failure is None
    )


def describe_models(registry: ModelRegistry) -> dict[str, Any]:
    """The registry, for the other API processes: its version and every model, with what it takes
    to serve a shareable one locally."""
    models = []
    for name, model in registry.models.items():
        entry: dict[str, Any] = {"name": name, "kind": model.kind, "shared": shareable(model)}
        if entry["shared"]:
            assert isinstance(model, EngineModel) and model.client is not None
            entry.update(
                backend=model.backend,
                socket=model.client.init.listen_path,  # type: ignore[attr-defined]
                info=dict(model.client.info),
                path=str(model.path),
                vocab_size=model.vocab_size,
                registration=model.registration,
                adapters=[vars(info) for info in model.adapters.entries.values()],
            )
        models.append(entry)
    return {"version": registry.version, "models": models}
