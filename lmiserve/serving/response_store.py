"""Responses kept for ``GET /v1/responses/{id}`` and ``previous_response_id``, in memory.

Each stored response keeps its response object and its whole conversation (the earlier turns, its
input items and its output items), so that a request naming it as ``previous_response_id`` goes on
from there. The store holds at most ``size`` responses (storing one more forgets the oldest) for
at most ``ttl`` seconds each; it lives in the main API process, and is gone when the server stops.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    """The response object, as ``GET /v1/responses/{id}`` returns it."""
    conversation: list[dict[str, Any]]
    """Every item of the conversation up to and including this response's output."""
    expires: float
    """When the store forgets it (the clock's time; infinity: never)."""


class ResponseStore:
    """At most ``size`` responses (0: none kept), each for ``ttl`` seconds (0: until pushed out by
    newer ones); ``clock`` tells the time in seconds."""

    def __init__(self, size: int, ttl: float, clock: Callable[[], float] = time.monotonic):
        self.size = size
        self.ttl = ttl
        self.clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        """Keep ``response`` (under its ``id``) and the ``conversation`` it ends."""
        if self.size <= 0:
            return
        self._expire()
        expires = self.clock() + self.ttl if self.ttl > 0 else float("inf")
        self._entries.pop(response["id"], None)
        self._entries[response["id"]] = StoredResponse(response, conversation, expires)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None when it was never stored, was deleted or has expired."""
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Forget a response; False when there was none to forget."""
        self._expire()
        return self._entries.pop(response_id, None) is not None

    def _expire(self) -> None:
        now = self.clock()
        while self._entries:
            first = next(iter(self._entries.values()))
            if first.expires > now:
                return
            self._entries.popitem(last=False)
