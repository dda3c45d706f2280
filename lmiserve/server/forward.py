"""The API processes beside the main one: answer inference for engine models here, pass the rest on.

Such a process serves an inference request (a POST to one of :data:`DATA_PLANE` paths) itself
when every model of the main process is an engine model attached here; anything else (the
management API, adapters, ``/ping``, ``/metrics``, handler models, multi-model mode, a model
still loading) goes to the main process over its private Unix socket, request and response
streamed through unchanged. Before each request the registry's shared version is read: when the
main process changed its models, their description is fetched again, so a model loaded,
unloaded or given an adapter through any process is seen at once by every other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from typing import Any

import httpx

from ..serving import AttachedModels, VersionFile
from .asgi import HttpMiddleware, refuse

log = logging.getLogger("lmiserve")

MAIN_SOCKET = "main.sock"
VERSION_FILE = "version"
STATE_PATH = "/_api_processes/state"
"""Served to the other API processes over the private socket only."""
CLIENT_HEADER = b"x-lmiserve-client"
"""The client's address, added to a forwarded request (trusted over the private socket only)."""
PROCESS_HEADER = b"x-api-process"
"""On every response: the API process that accepted the client's connection (0: the main one)."""
FORWARDED_HEADER = b"x-api-process-forwarded"
"""On a response another API process passed on from the main one: "0"."""
DATA_PLANE = ("/", "/invocations", "/generate", "/generate_stream", "/tokenize", "/detokenize")
DATA_PLANE_PREFIXES = ("/predictions/", "/v1/", "/serving-endpoints/", "/v2/models/")
MAIN_ONLY = ("/v1/responses",)
"""Inference the main process serves itself: it keeps the stored responses of the Responses API."""
_HOP = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", CLIENT_HEADER}
UNAVAILABLE = json.dumps({"code": 503, "message": "Service Unavailable", "error": "the server is restarting"}).encode()


def private(scope: dict[str, Any]) -> bool:
    """A request over a Unix socket (uvicorn names its server by path, with no port): from
    another API process, through the private directory only this server's user can reach."""
    server = scope.get("server")
    return server is None or server[1] is None


def is_data_plane(scope: dict[str, Any]) -> bool:
    path = scope["path"]
    if path.startswith(MAIN_ONLY):
        return False
    return scope["method"] == "POST" and (path in DATA_PLANE or path.startswith(DATA_PLANE_PREFIXES))


class ProcessHeader(HttpMiddleware):
    """Names this API process on every response to a client."""

    def __init__(self, app: Any, index: int):
        super().__init__(app)
        self.value = str(index).encode()

    async def http(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if private(scope):
            return await self.app(scope, receive, send)

        async def send_named(message):  # type: ignore[no-untyped-def]
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (PROCESS_HEADER, self.value)]
            await send(message)

        return await self.app(scope, receive, send_named)


class MainLink:
    """This process's view of the main one: the shared version, the models, and forwarding."""

    def __init__(self, directory: str, models: AttachedModels):
        self.models = models
        self.version = VersionFile(os.path.join(directory, VERSION_FILE))
        transport = httpx.AsyncHTTPTransport(uds=os.path.join(directory, MAIN_SOCKET))
        self.http = httpx.AsyncClient(transport=transport, base_url="http://main", timeout=None)
        self._sync = asyncio.Lock()

    async def sync(self) -> None:
        """Fetch the main process's models again if they changed since last time."""
        if self.version.read() == self.models.version:
            return
        async with self._sync:
            if self.version.read() == self.models.version:
                return
            try:
                state = (await self.http.get(STATE_PATH)).json()
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("the main API process did not describe its models: %s", exc)
                return
            await self.models.apply(state)

    def local(self, scope: dict[str, Any]) -> bool:
        return self.models.complete and is_data_plane(scope)

    async def forward(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        headers = [(k, v) for k, v in scope["headers"] if k not in _HOP]
        client = scope.get("client")
        if client:
            headers.append((CLIENT_HEADER, f"{client[0]}:{client[1]}".encode()))
        done = asyncio.Event()

        async def body():  # type: ignore[no-untyped-def]
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    done.set()
                    return
                yield message.get("body", b"")
                if not message.get("more_body"):
                    return

        path = scope.get("raw_path") or scope["path"].encode()
        url = path.decode("latin-1") + ("?" + scope["query_string"].decode("latin-1") if scope["query_string"] else "")
        request = self.http.build_request(scope["method"], url, headers=headers, content=body())
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            log.warning("could not reach the main API process: %s", exc)
            return await refuse(send, 503, UNAVAILABLE, (b"retry-after", b"1"))
        watch = asyncio.create_task(self._watch_disconnect(receive, done, response))
        try:
            out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
            out.append((FORWARDED_HEADER, b"0"))
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            async for chunk in response.aiter_raw():
                if done.is_set():
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except httpx.HTTPError as exc:
            log.warning("the main API process broke off a response: %s", exc)
        finally:
            watch.cancel()
            await response.aclose()

    @staticmethod
    async def _watch_disconnect(receive, done: asyncio.Event, response: httpx.Response) -> None:  # type: ignore[no-untyped-def]
        """The client hung up: stop reading from the main process (which then sees it too)."""
        with contextlib.suppress(Exception):
            while not done.is_set():
                message = await receive()
                if message["type"] == "http.disconnect":
                    done.set()
                    await response.aclose()

    async def close(self) -> None:
        await self.http.aclose()
        self.version.close()


class Forward(HttpMiddleware):
    """Serves here what this process can, and passes the rest to the main process."""

    def __init__(self, app: Any, link: MainLink):
        super().__init__(app)
        self.link = link

    async def http(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if private(scope):  # the main process, asking this one for its own metrics
            return await self.app(scope, receive, send)
        await self.link.sync()
        if self.link.local(scope):
            return await self.app(scope, receive, send)
        return await self.link.forward(scope, receive, send)
