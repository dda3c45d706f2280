"""An engine client for an API process beside the one that started the engine.

The engine process accepts more connections on a Unix socket (``InitEngine.listen_path``).
:class:`AttachedEngineClient` is one of them: it submits, aborts and receives deltas like
:class:`~lmiserve.rolling_batch.process.client.ProcessEngineClient`, but owns no process: the API
process that started the engine restarts it, and a closed connection only ends the requests
sent through it (``on_exit`` tells the model).
"""

from __future__ import annotations

import asyncio
import time

from .client import SocketEngineClient


class AttachedEngineClient(SocketEngineClient):
    def __init__(self, path: str, info: dict[str, str | int | float] | None = None):
        super().__init__()
        self.path = path
        self.info = dict(info or {})

    async def start(self, timeout: float = 30) -> None:
        reader, self._writer = await asyncio.wait_for(asyncio.open_unix_connection(self.path), timeout)
        self.alive = True
        self.last_progress = time.monotonic()
        self._reader_task = asyncio.create_task(self._read(reader), name="attached-engine-reader")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            await self._receive(reader)
        finally:
            self._close_connection()
        self._gone("the engine process exited while handling this request", restart=not self.stopping)

    async def stop(self, grace: float = 0) -> None:
        self.stopping = True
        self.alive = False
        self._close_connection()
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)
