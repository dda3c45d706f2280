"""The engine's own process: receives requests, steps the engine, streams token ids back.

Started as ``python -m lmiserve.rolling_batch.engine_process --fd N`` with one end of a
socket pair; the first message is :class:`~lmiserve.wire.InitEngine`. A reader thread
queues incoming messages so that requests join the batch at the next step without ever
waiting for a step to finish.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable

from .. import wire
from ..child import run_child
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
