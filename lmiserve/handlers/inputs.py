"""``Input``: what a handler's ``handle(inputs)`` receives, with the method names DJL code uses."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


class Input:
    """A request (or, in a dynamic batch, a batch of requests) given to a handler.

    Properties are the request headers, query parameters and SageMaker custom attributes
    (or, for the first call, the model's configuration). Content is a list of
    ``(key, bytes)`` pairs; an HTTP body arrives under the key ``data``.
    """

    def __init__(
        self,
        properties: dict[str, str] | None = None,
        content: Iterable[tuple[str, bytes]] | None = None,
        batch: list[Input] | None = None,
    ):
        self._properties = dict(properties or {})
        self._content = [(k, bytes(v)) for k, v in (content or [])]
        self._batch = list(batch) if batch is not None else None

    # --- properties -------------------------------------------------------------------
    def get_properties(self) -> dict[str, str]:
        return self._properties

    def get_property(self, key: str, default: str | None = None) -> str | None:
        """A property by name, ignoring case."""
        if key in self._properties:
            return self._properties[key]
        lowered = key.lower()
        for k, v in self._properties.items():
            if k.lower() == lowered:
                return v
        return default

    def add_property(self, key: str, value: str) -> None:
        self._properties[key] = value

    # --- batches ----------------------------------------------------------------------
    def is_batch(self) -> bool:
        """True when this input holds more than one request (dynamic batching)."""
        return self._batch is not None and len(self._batch) > 1

    def get_batches(self) -> list[Input]:
        return list(self._batch) if self._batch is not None else [self]

    def get_batch_size(self) -> int:
        return len(self._batch) if self._batch is not None else 1

    # --- content ----------------------------------------------------------------------
    def is_empty(self) -> bool:
        if self._batch is not None:
            return all(b.is_empty() for b in self._batch)
        return not self._content

    def contains_key(self, key: str) -> bool:
        return any(k == key for k, _ in self._content)

    def get_content(self) -> list[tuple[str, bytes]]:
        return list(self._content)

    def get_data(self, key: str | None = None) -> bytes:
        return self.get_as_bytes(key)

    def get_as_bytes(self, key: str | None = None) -> bytes:
        if self._batch is not None and len(self._batch) > 1:
            raise ValueError("this input is a batch of requests; read each one from get_batches()")
        if self._batch is not None:
            return self._batch[0].get_as_bytes(key)
        if key is None:
            for k, v in self._content:
                if k == "data":
                    return v
            return self._content[0][1] if self._content else b""
        for k, v in self._content:
            if k == key:
                return v
        raise KeyError(f"no content named {key!r}")

    def get_as_string(self, key: str | None = None) -> str:
        return self.get_as_bytes(key).decode("utf-8")

    def get_as_json(self, key: str | None = None) -> Any:
        return json.loads(self.get_as_bytes(key))

    def __repr__(self) -> str:
        if self._batch is not None:
            return f"Input(batch of {len(self._batch)})"
        return f"Input(properties={len(self._properties)}, content={[k for k, _ in self._content]})"
