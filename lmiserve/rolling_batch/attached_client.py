"""An engine client for an API process beside the one that started the engine.

The engine process accepts more connections on a Unix socket (``InitEngine.listen_path``).
:class:`AttachedEngineClient` is one of them: it submits, aborts and receives deltas like
:class:`~lmiserve.rolling_batch.client.ProcessEngineClient`, but owns no process: the API
process that started the engine restarts it, and a closed connection only ends the requests
sent through it (``on_exit`` tells the model).
"""

from __future__ import annotations

import asyncio
import time

from .. import wire
from ..errors import WorkerDied
from .client import EngineClient


class AttachedEngineClient(EngineClient):
    def __init__(self, path: str, info: dict[str, str | int | float] | None = None):
        super().__init__()
        self.path = path
        self.info = dict(info or {})
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self.stopping = False

    async def start(self, timeout: float = 30) -> None:
        reader, self._writer = await asyncio.wait_for(asyncio.open_unix_connection(self.path), timeout)
        self.alive = True
        self.last_progress = time.monotonic()
        self._reader_task = asyncio.create_task(self._read(reader), name="attached-engine-reader")

    def _send(self, msg: wire.Msg) -> None:
        if self._writer is None or self._writer.is_closing():
            raise WorkerDied("the engine is not running")
        wire.write(self._writer, msg)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            msg = await wire.read(reader)
            if msg is None:
                break
            if isinstance(msg, wire.EngineStep):
                self._on_step(msg)
            elif isinstance(msg, wire.AdapterResult):
                self._on_adapter_result(msg)
        self._gone("the engine process exited while handling this request", restart=not self.stopping)

    async def stop(self, grace: float = 0) -> None:
        self.stopping = True
        self.alive = False
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)
