"""A bounded queue of waiting requests that hands them out in dynamic batches."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class QueueFull(Exception):
    pass


class JobQueue(Generic[T]):
    """FIFO with a size limit; :meth:`get_batch` waits for one item, then gathers more
    until the batch is full or ``max_delay`` has passed since the first one was taken."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._items: deque[T] = deque()
        self._event = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: T) -> None:
        if len(self._items) >= self.maxsize:
            raise QueueFull(f"{len(self._items)} requests are already waiting")
        self._items.append(item)
        self._event.set()

    def put_front(self, items: list[T]) -> None:
        """Return items taken by a worker that could not run them; they keep their turn."""
        self._items.extendleft(reversed(items))
        self._event.set()

    def remove(self, item: T) -> bool:
        try:
            self._items.remove(item)
            return True
        except ValueError:
            return False

    def drain(self) -> list[T]:
        items = list(self._items)
        self._items.clear()
        return items

    async def _wait_nonempty(self, deadline: float | None) -> bool:
        while not self._items:
            self._event.clear()
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return False
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                return bool(self._items)
        return True

    async def get_batch(self, max_size: int, max_delay: float, idle_timeout: float | None = None) -> list[T]:
        """Up to ``max_size`` items. Returns [] when nothing arrived within ``idle_timeout``."""
        first_deadline = None if idle_timeout is None else time.monotonic() + idle_timeout
        if not await self._wait_nonempty(first_deadline):
            return []
        batch = [self._items.popleft()]
        deadline = time.monotonic() + max_delay
        while len(batch) < max_size:
            if not self._items and not await self._wait_nonempty(deadline):
                break
            while self._items and len(batch) < max_size:
                batch.append(self._items.popleft())
        return batch
