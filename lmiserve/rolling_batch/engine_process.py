"""The engine's own process: receives requests, steps the engine, streams token ids back.

Started as ``python -m lmiserve.rolling_batch.engine_process --fd N`` with one end of a
socket pair; the first message is :class:`~lmiserve.wire.InitEngine`. A reader thread
queues incoming messages so that requests join the batch at the next step without ever
waiting for a step to finish. :class:`InProcessEngineClient` runs the same loop on a thread of
the calling process instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable

from .. import wire
from ..child import EXIT_GRACE_S, run_child
from ..errors import WorkerDied
from .client import EngineClient, EngineStartError
from .engine import Engine, RequestRejected
from .placement import engine_config

log = logging.getLogger("lmiserve.engine")

HEARTBEAT_SECONDS = 1.0
"""While it has work, the loop reports its statistics at least this often, even for steps that
produce no token (prompt chunks): the server takes silence with requests in flight for a stall."""


class EngineLoop:
    """Feeds an engine from an inbox and sends each step's output through ``send``."""

    def __init__(self, engine: Engine, send):  # type: ignore[no-untyped-def]
        self.engine = engine
        self.send = send
        self.inbox: queue.Queue[wire.Message | None] = queue.Queue()
        self._last_sent = time.monotonic()

    def _handle(self, msg: wire.Message | None) -> bool:
        """Apply one message; False when the loop should stop."""
        if msg is None or isinstance(msg, wire.Shutdown):
            return False
        if isinstance(msg, wire.GenerateRequest):
            try:
                self.engine.add_request(msg.request_id, msg.prompt_ids, msg.params, msg.adapter)
            except RequestRejected as exc:
                refused = wire.SeqDelta(
                    request_id=msg.request_id, finish_reason="error", error=str(exc), error_kind="validation"
                )
                self.send(wire.EngineStep(deltas=[refused]))
        elif isinstance(msg, wire.AdapterCommand):
            self.send(self.engine.adapter_command(msg))
        elif isinstance(msg, wire.AbortRequest):
            for request_id in msg.request_ids:
                self.engine.abort(request_id, msg.index)
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
                msg = self.inbox.get(block=block)
            except queue.Empty:
                msg = ...
            aborted = False
            while msg is not ...:
                if not self._handle(msg):  # type: ignore[arg-type]
                    return
                aborted = aborted or isinstance(msg, wire.AbortRequest)
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    msg = ...
            deltas = self.engine.step()
            now = time.monotonic()
            if deltas or aborted or now - self._last_sent >= HEARTBEAT_SECONDS:
                self.send(wire.EngineStep(deltas=deltas, stats=self.engine.stats()))
                self._last_sent = now


class InProcessEngineClient(EngineClient):
    """Our engine on a thread of this process (for tests and model development)."""

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
        self._loop_obj.inbox.put(msg)

    async def stop(self, grace: float = 2 * EXIT_GRACE_S) -> None:
        self.alive = False
        if self._loop_obj is not None:
            self._loop_obj.inbox.put(wire.Shutdown())
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, grace)
        self.alive = False


def _rank_failed(reason: str) -> None:
    """A tensor-parallel rank died: end this process, so the server fails the requests in
    flight and starts the engine again (the other ranks die with it)."""
    log.error("stopping the engine: %s", reason)
    os._exit(1)


def _start(sock: socket.socket, init: wire.InitEngine) -> Callable[[], None]:
    """Build the engine, say it is ready, and hand back its loop; a reader thread feeds the
    loop's inbox from the socket."""
    engine = Engine(engine_config(init.model_path, init.options), on_rank_failure=_rank_failed)
    lock = threading.Lock()

    def send(msg: wire.Msg) -> None:
        with lock:
            wire.send(sock, msg)

    loop = EngineLoop(engine, send)

    def read() -> None:
        while True:
            msg = wire.recv(sock)
            loop.inbox.put(msg)
            if msg is None:
                return

    threading.Thread(target=read, name="engine-inbox", daemon=True).start()
    send(wire.EngineReady(info=engine.info))
    return loop.run


def main(argv: list[str] | None = None) -> int:
    label = lambda i: f"{i.model_name} engine"  # noqa: E731
    return run_child(sys.argv[1:] if argv is None else argv, wire.InitEngine, label, wire.EngineFailed, _start)


if __name__ == "__main__":
    sys.exit(main())
