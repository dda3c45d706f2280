"""Messages from the engine to one API process, sent by a thread of their own.

The engine loop must never wait on a socket: an API process that falls behind (a slow client,
a busy event loop) would otherwise stall every request of the batch. :meth:`Outbox.put` only
queues; a sender thread writes. While the sender is behind, a new :class:`~lmiserve.wire.EngineStep`
is merged into the step still waiting at the tail (deltas concatenated in order, the latest
statistics kept), so the outbox holds a bounded number of messages however long the peer lags,
and no delta is lost, reordered or sent twice.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import deque
from collections.abc import Callable

from .. import wire

log = logging.getLogger("lmiserve.engine")


class _PendingStep:
    """An EngineStep not sent yet, that later steps are merged into."""

    __slots__ = ("deltas", "stats")

    def __init__(self, step: wire.EngineStep):
        self.deltas = list(step.deltas)
        self.stats = step.stats

    def merge(self, step: wire.EngineStep) -> None:
        self.deltas.extend(step.deltas)
        if step.stats is not None:
            self.stats = step.stats

    def message(self) -> wire.EngineStep:
        return wire.EngineStep(deltas=self.deltas, stats=self.stats)


class Outbox:
    """A non-blocking queue of messages to ``sock``, drained by a sender thread.

    ``on_closed`` is called (from the sender thread) once, when a send fails: the peer is gone.
    """

    def __init__(self, sock: socket.socket, name: str = "engine-outbox", on_closed: Callable[[], None] | None = None):
        self._sock = sock
        self._items: deque[wire.Msg | _PendingStep] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._on_closed = on_closed
        self.merged = 0
        """Steps merged into a step already waiting (how often the peer was behind)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, msg: wire.Msg) -> None:
        """Queue ``msg``; never blocks on the socket (dropped once the peer is gone)."""
        with self._cond:
            if self._closed:
                return
            if isinstance(msg, wire.EngineStep):
                tail = self._items[-1] if self._items else None
                if isinstance(tail, _PendingStep):
                    tail.merge(msg)
                    self.merged += 1
                    return
                self._items.append(_PendingStep(msg))
            else:
                self._items.append(msg)
            self._cond.notify()

    def close(self) -> None:
        """Stop after the messages already queued have been sent."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _take(self) -> list[wire.Msg | _PendingStep] | None:
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            if not self._items:
                return None
            items = list(self._items)
            self._items.clear()
            return items

    def _run(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            try:
                for item in items:
                    wire.send(self._sock, item.message() if isinstance(item, _PendingStep) else item)
            except OSError as exc:
                log.debug("an engine connection closed: %s", exc)
                with self._cond:
                    self._closed = True
                    self._items.clear()
                if self._on_closed is not None:
                    self._on_closed()
                return
