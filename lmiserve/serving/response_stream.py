"""The API process's view of one request's answer as it comes back from a worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .. import wire
from ..errors import LmiServeError


@dataclass
class _End:
    error: LmiServeError | None = None


class ResponseStream:
    """A head (status, headers, maybe the whole body), then body chunks, then the end."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.head: asyncio.Future[wire.ResponseHead] = asyncio.get_running_loop().create_future()
        # an error nobody awaited (the client left) is not worth a warning
        self.head.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._chunks: asyncio.Queue[bytes | _End] = asyncio.Queue()
        self.finished = False

    def on_head(self, head: wire.ResponseHead) -> None:
        if not self.head.done():
            self.head.set_result(head)
            if not head.streaming:
                self.finished = True

    def on_chunk(self, data: bytes) -> None:
        self._chunks.put_nowait(data)

    def on_end(self, error: LmiServeError | None = None) -> None:
        if not self.finished:
            self.finished = True
            self._chunks.put_nowait(_End(error))

    def fail(self, error: LmiServeError) -> None:
        """End the request with an error, before or after its head."""
        if not self.head.done():
            self.head.set_exception(error)
            self.finished = True
        else:
            self.on_end(error)

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body chunks of a streaming answer; raises the error that ended it, if any."""
        while True:
            item = await self._chunks.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
