"""A lean HTTP/1.1 client for the load generator: one kept-alive connection per client, the
request written in one call, a streamed answer read chunk by chunk and handed over a line at a
time, without a general HTTP library's per-line costs. It speaks just what the benchmark needs:
POST with a JSON body, answers framed by ``Transfer-Encoding: chunked``, ``Content-Length``, or
the end of the connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import urlsplit

MAX_ERROR_BODY = 200


class HttpError(Exception):
    """The connection broke or the server's answer was not HTTP/1.1 as expected."""


class Connection:
    def __init__(self, base_url: str, timeout: float = 600.0):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the benchmark client speaks plain http to a host: {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.connects = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(
        self, path: str, body: bytes, on_line: Callable[[bytes], None], headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``path``, with ``headers`` besides the usual ones; each line of a
        200 answer goes to ``on_line`` as it arrives (without its line end). Returns the status and,
        for any other status, the start of the answer's body."""
        try:
            return await asyncio.wait_for(self._post(path, body, on_line, headers or {}), self.timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            raise HttpError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            self.close()  # a half-read answer leaves the connection unusable
            raise

    async def _post(
        self, path: str, body: bytes, on_line: Callable[[bytes], None], extra: dict[str, str]
    ) -> tuple[int, bytes]:
        reused = self._writer is not None and not self._writer.is_closing()
        if not reused:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
            self.connects += 1
        reader, writer = self._reader, self._writer
        assert reader is not None
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: */*\r\nContent-Length: {len(body)}\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in extra.items())
            + "\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        status_line = await reader.readline()
        if not status_line and reused:
            # the server closed the idle connection as the request went out (its keep-alive timeout):
            # nothing was answered, so the request goes again on a new connection, as HTTP clients do
            self.close()
            return await self._post(path, body, on_line, extra)
        fields = status_line.split(None, 2)
        if len(fields) < 2 or not fields[0].startswith(b"HTTP/1."):
            raise HttpError(f"not an HTTP/1.x answer: {status_line[:80]!r}")
        status = int(fields[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        lines = _Lines(on_line if status == 200 else None)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                lines.feed((await reader.readexactly(size + 2))[:-2])
        elif "content-length" in headers:
            lines.feed(await reader.readexactly(int(headers["content-length"])))
        else:
            lines.feed(await reader.read())
            headers["connection"] = "close"
        lines.end()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, lines.kept[:MAX_ERROR_BODY]

    @property
    def open(self) -> bool:
        """Kept alive after the last answer: the next request may reuse it."""
        return self._writer is not None and not self._writer.is_closing()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


class _Lines:
    """Bytes in, whole lines out (to ``on_line``); without a callback, the bytes are kept."""

    def __init__(self, on_line: Callable[[bytes], None] | None):
        self.on_line = on_line
        self.pending = b""
        self.kept = b""

    def feed(self, data: bytes) -> None:
        if self.on_line is None:
            if len(self.kept) < MAX_ERROR_BODY:
                self.kept += data
            return
        data = self.pending + data
        *complete, self.pending = data.split(b"\n")
        for line in complete:
            self.on_line(line.rstrip(b"\r"))

    def end(self) -> None:
        if self.on_line is not None and self.pending:
            self.on_line(self.pending.rstrip(b"\r"))
        self.pending = b""
