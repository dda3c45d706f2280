"""Messages from the engine to one API process: written at once where the socket takes them,
else by a thread of their own.

The engine loop must never wait on a socket: an API process that falls behind (a slow client,
a busy event loop) would otherwise stall every request of the batch. :meth:`Outbox.put` writes
a message itself only while nothing is waiting and the socket takes it without blocking (the
usual case: a step's deltas reach the API process as the step ends, not when the operating
system next runs the sender thread, which on a machine whose cores the step's threads keep busy
was a few milliseconds later for one step in ten). What the socket does not take, and every
message while others wait, is queued for a sender thread. While the sender is behind, a new
:class:`~lmiserve.wire.EngineStep` is merged into the step still waiting at the tail (deltas
concatenated in order, the latest statistics kept), so the outbox holds a bounded number of
messages however long the peer lags, and no delta is lost, reordered or sent twice.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import deque
from collections.abc import Callable

from ... import wire

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
    """Messages to ``sock``: written by :meth:`put` where the socket takes them at once, else
    queued for a sender thread.

    ``on_closed`` is called (from the sender thread) once, when a send fails: the peer is gone.
    """

    def __init__(self, sock: socket.socket, name: str = "engine-outbox", on_closed: Callable[[], None] | None = None):
        self._sock = sock
        self._items: deque[wire.Msg | _PendingStep | bytes] = deque()
        """Waiting to be sent, in order; bytes: the rest of a message :meth:`put` began to write."""
        self._cond = threading.Condition()
        self._closed = False
        self._sending = False
        """The sender thread is writing what it took: nothing may be written before it is done."""
        self._on_closed = on_closed
        self.merged = 0
        """Steps merged into a step already waiting (how often the peer was behind)."""
        self.written = 0
        """Messages :meth:`put` began to write itself (the rest of any it could not finish went
        to the sender thread)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, msg: wire.Msg) -> None:
        """Send ``msg``: at once where nothing waits and the socket takes it without blocking,
        else queued. Never blocks on the socket; dropped once the peer is gone."""
        with self._cond:
            if self._closed:
                return
            if not self._items and not self._sending and self._write_now(msg):
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

    def _write_now(self, msg: wire.Msg) -> bool:
        """With the lock held, nothing queued and the sender idle: as much of ``msg`` as the
        socket takes without blocking, the rest queued for the sender. False where nothing could
        be written (the socket is full, or failed: the sender then meets the failure itself)."""
        data = wire.frame(msg)
        try:
            sent = self._sock.send(data, socket.MSG_DONTWAIT)
        except OSError:  # BlockingIOError included
            return False
        self.written += 1
        if sent < len(data):
            self._items.append(data[sent:])
            self._cond.notify()
        return True

    def close(self) -> None:
        """Stop after the messages already queued have been sent."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _take(self) -> list[wire.Msg | _PendingStep | bytes] | None:
        with self._cond:
            self._sending = False
            while not self._items and not self._closed:
                self._cond.wait()
            if not self._items:
                return None
            items = list(self._items)
            self._items.clear()
            self._sending = True
            return items

    def _run(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            try:
                for item in items:
                    if isinstance(item, bytes):
                        self._sock.sendall(item)
                    else:
                        wire.send(self._sock, item.message() if isinstance(item, _PendingStep) else item)
            except OSError as exc:
                log.debug("an engine connection closed: %s", exc)
                with self._cond:
                    self._closed = True
                    self._items.clear()
                if self._on_closed is not None:
                    self._on_closed()
                return
