"""The engine's own process: receives requests, steps the engine, streams token ids back.

Started as ``python -m lmiserve.rolling_batch.process.engine_process --fd N`` with one end of a
socket pair; the first message is :class:`~lmiserve.wire.InitEngine`. A reader thread
queues incoming messages so that requests join the batch at the next step without ever
waiting for a step to finish, and an outbox (:mod:`.outbox`) sends, so that a step never waits
for an API process to read. With ``InitEngine.listen_path`` the engine also accepts the API
processes beside the first (``api_processes``) on that Unix socket. :class:`InProcessEngineClient`
runs the same loop on a thread of the calling process instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable

from ... import wire
from ...child import EXIT_GRACE_S, run_child
from ...errors import WorkerDied
from ..core.engine import Engine, RequestRejected
from ..runner.placement import engine_config
from .client import EngineClient, EngineStartError
from .outbox import Outbox

log = logging.getLogger("lmiserve.engine")

HEARTBEAT_SECONDS = 1.0
"""While it has work, the loop reports its statistics at least this often, even for steps that
produce no token (prompt chunks): the server takes silence with requests in flight for a stall."""


_EMPTY = object()


class Connection:
    """One API process's link to the engine: where its messages go, and the requests it sent."""

    def __init__(self, send: Callable[[wire.Msg], None], name: str = "api"):
        self.send = send
        self.name = name
        self.requests: set[str] = set()


class EngineLoop:
    """Feeds an engine from an inbox and sends each step's output to the connection that owns it.

    The first connection (``send``) is the API process that started the engine: when it goes,
    the loop stops. Others join with :meth:`connect` (API processes beside it); each owns the
    requests it sent, its aborts reach only those, and when it goes they are aborted.
    """

    def __init__(self, engine: Engine, send: Callable[[wire.Msg], None]):
        self.engine = engine
        self.primary = Connection(send, "primary")
        self.inbox: queue.Queue[tuple[Connection, wire.Message | None] | wire.Message | None] = queue.Queue()
        """What the connections sent, as (connection, message); a bare message is the primary's."""
        self.owners: dict[str, Connection] = {}
        self._connections = [self.primary]
        self._last_sent = time.monotonic()

    def post(self, msg: wire.Message | None, conn: Connection | None = None) -> None:
        """Hand the loop a message from ``conn`` (the primary connection by default); None: it closed."""
        self.inbox.put((conn or self.primary, msg))

    def connect(self, send: Callable[[wire.Msg], None], name: str) -> Connection:
        conn = Connection(send, name)
        self._connections.append(conn)  # only ever appended from the accepting thread
        return conn

    def _refuse(self, conn: Connection, request_id: str, error: str) -> None:
        refused = wire.SeqDelta(request_id=request_id, finish_reason="error", error=error, error_kind="validation")
        conn.send(wire.EngineStep(deltas=[refused]))

    def _handle(self, conn: Connection, msg: wire.Message | None) -> bool:
        """Apply one message; False when the loop should stop."""
        if msg is None and conn is not self.primary:  # another API process went: end its requests
            for request_id in list(conn.requests):
                self.engine.abort(request_id)
                self.owners.pop(request_id, None)
            conn.requests.clear()
            if conn in self._connections:
                self._connections.remove(conn)
            return True
        if msg is None or isinstance(msg, wire.Shutdown):
            return False
        if isinstance(msg, wire.GenerateRequest):
            if msg.request_id in self.owners:
                self._refuse(conn, msg.request_id, f"request id {msg.request_id!r} is already running")
                return True
            try:
                self.engine.submit(msg)
            except RequestRejected as exc:
                self._refuse(conn, msg.request_id, str(exc))
                return True
            self.owners[msg.request_id] = conn
            conn.requests.add(msg.request_id)
        elif isinstance(msg, wire.AdapterCommand):
            conn.send(self.engine.adapter_command(msg))
        elif isinstance(msg, wire.AbortRequest):
            for request_id in msg.request_ids:
                if self.owners.get(request_id) is conn:
                    self.engine.abort(request_id, msg.index)
                    if request_id not in self.engine.groups:  # ended without a delta
                        del self.owners[request_id]
                        conn.requests.discard(request_id)
        return True

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.engine.close()

    def _run(self) -> None:
        while True:
            # wait for work when idle; otherwise take whatever arrived since the last step
            block = not self.engine.has_work()
            try:
                item = self.inbox.get(block=block)
            except queue.Empty:
                item = _EMPTY
            aborted = False
            while item is not _EMPTY:
                # (connection, message); a bare message is the primary connection's
                conn, msg = item if isinstance(item, tuple) else (self.primary, item)
                if not self._handle(conn, msg):
                    return
                aborted = aborted or isinstance(msg, wire.AbortRequest)
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    item = _EMPTY
            deltas = self.engine.step()
            now = time.monotonic()
            heartbeat = now - self._last_sent >= HEARTBEAT_SECONDS
            if deltas or aborted or heartbeat:
                self._dispatch(deltas, self.engine.stats(), heartbeat)
                self._last_sent = now

    def _dispatch(self, deltas: list[wire.SeqDelta], stats: wire.EngineStats, heartbeat: bool) -> None:
        """Each connection's deltas to it (the primary always hears of a step; others when they
        have deltas, or on a heartbeat)."""
        if len(self._connections) == 1:
            routed = {self.primary: deltas}
        else:
            routed = {conn: [] for conn in self._connections if heartbeat or conn is self.primary}
            for delta in deltas:
                owner = self.owners.get(delta.request_id, self.primary)
                routed.setdefault(owner, []).append(delta)
        for delta in deltas:
            if delta.finish_reason is not None and delta.request_id not in self.engine.groups:
                owner = self.owners.pop(delta.request_id, None)
                if owner is not None:
                    owner.requests.discard(delta.request_id)
        for conn, own in routed.items():
            conn.send(wire.EngineStep(deltas=own, stats=stats))


class InProcessEngineClient(EngineClient):
    """Our engine on a thread of this process (for tests and model development)."""

    resumes = True

    def __init__(self, engine_factory: Callable[[], object]):
        super().__init__()
        self._factory = engine_factory
        self._loop_obj = None
        self._thread: threading.Thread | None = None

    async def start(self, timeout: float = 600) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def send(msg: wire.Msg) -> None:
            if isinstance(msg, wire.EngineStep):
                loop.call_soon_threadsafe(self._on_step, msg)
            elif isinstance(msg, wire.AdapterResult):
                loop.call_soon_threadsafe(self._on_adapter_result, msg)

        def run() -> None:
            try:
                engine = self._factory()
                self._loop_obj = EngineLoop(engine, send)  # type: ignore[arg-type]
                self.info = dict(engine.info)  # type: ignore[attr-defined]
                loop.call_soon_threadsafe(ready.set_result, None)
            except BaseException as exc:  # noqa: BLE001
                detail = "".join(traceback.format_exception(exc))
                loop.call_soon_threadsafe(ready.set_exception, EngineStartError(detail))
                return
            try:
                self._loop_obj.run()
            except BaseException:  # noqa: BLE001
                log.exception("the engine thread failed")
            loop.call_soon_threadsafe(self._gone, "the engine thread stopped")

        self._thread = threading.Thread(target=run, name="engine", daemon=True)
        self._thread.start()
        await asyncio.wait_for(ready, timeout)
        self.alive = True

    def _send(self, msg: wire.Msg) -> None:
        if self._loop_obj is None:
            raise WorkerDied("the engine is not running")
        self._loop_obj.post(msg)

    async def stop(self, grace: float = 2 * EXIT_GRACE_S) -> None:
        self.alive = False
        if self._loop_obj is not None:
            self._loop_obj.post(wire.Shutdown())
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, grace)
        self.alive = False


def _rank_failed(reason: str) -> None:
    """A tensor-parallel rank died: end this process, so the server fails the requests in
    flight and starts the engine again (the other ranks die with it)."""
    log.error("stopping the engine: %s", reason)
    os._exit(1)


def _read_into(loop: EngineLoop, sock: socket.socket, conn: Connection) -> None:
    """Feed ``loop`` from ``sock`` until it closes (then post None for it)."""
    while True:
        try:
            msg = wire.recv(sock)
        except OSError:
            msg = None
        loop.post(msg, conn)
        if msg is None:
            return


def listen(loop: EngineLoop, path: str) -> socket.socket:
    """Accept API processes beside the first on the Unix socket ``path``: each connection gets
    an outbox and a reader of its own."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(64)
    count = itertools.count(1)

    def accept() -> None:
        while True:
            try:
                peer, _ = server.accept()
            except OSError:
                return
            name = f"api-{next(count)}"
            outbox = Outbox(peer, f"engine-outbox-{name}")
            conn = loop.connect(outbox.put, name)
            threading.Thread(
                target=_read_into, args=(loop, peer, conn), name=f"engine-inbox-{name}", daemon=True
            ).start()

    threading.Thread(target=accept, name="engine-accept", daemon=True).start()
    return server


def _start(sock: socket.socket, init: wire.InitEngine) -> Callable[[], None]:
    """Build the engine, say it is ready, and hand back its loop; a reader thread feeds the
    loop's inbox from the socket, an outbox sends to it, and with ``init.listen_path`` other
    API processes may connect."""
    engine = Engine(engine_config(init.model_path, init.options), on_rank_failure=_rank_failed)
    outbox = Outbox(sock)
    loop = EngineLoop(engine, outbox.put)
    threading.Thread(target=_read_into, args=(loop, sock, loop.primary), name="engine-inbox", daemon=True).start()
    if init.listen_path:
        listen(loop, init.listen_path)
    outbox.put(wire.EngineReady(info=engine.info))

    def serve() -> None:
        try:
            loop.run()
        finally:  # what the last steps produced still reaches the API process
            outbox.close()
            outbox.join(EXIT_GRACE_S)

    return serve


def main(argv: list[str] | None = None) -> int:
    label = lambda i: f"{i.model_name} engine"  # noqa: E731
    return run_child(sys.argv[1:] if argv is None else argv, wire.InitEngine, label, wire.EngineFailed, _start)


if __name__ == "__main__":
    sys.exit(main())
