"""Several API processes on one port: the main process's side.

With ``api_processes`` above 1 the main process binds the HTTP port with ``SO_REUSEPORT`` (the
kernel spreads new connections over every process bound to it) and starts the others
(:mod:`.api_process`), restarting one that dies. It keeps a private directory (mode 0700) for
what the processes share: its own Unix socket, where it serves the same app to the others (the
requests they pass on, and :data:`~.forward.STATE_PATH`); each other process's socket, where
it collects their metrics; each engine's socket; and the registry's version
(:class:`~lmiserve.serving.shared_state.VersionFile`). On SIGTERM it tells the others to drain
and waits for them before its models stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Any

import httpx

from ..child import ChildProcess, child_env
from ..config import Settings
from ..serving import ModelRegistry, VersionFile, describe_models, share_engine_sockets
from .forward import CLIENT_HEADER, MAIN_SOCKET, STATE_PATH, VERSION_FILE, ProcessHeader, private

log = logging.getLogger("lmiserve")

RESTART_DELAY_S = 1.0


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket that other processes of this user may bind too."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def unix_socket(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(2048)
    return sock


def process_socket(directory: str, index: int) -> str:
    return os.path.join(directory, f"api-{index}.sock")


class ApiProcesses:
    """The API processes beside this one: started, restarted, drained; their metrics collected."""

    def __init__(self, settings: Settings, count: int, argv: list[str]):
        self.settings = settings
        self.count = count
        self.argv = argv
        self.directory = tempfile.mkdtemp(prefix="lmiserve-api-")
        self.version = VersionFile(os.path.join(self.directory, VERSION_FILE), create=True)
        self.processes: dict[int, ChildProcess] = {}
        self.draining = False
        self._watchers: set[asyncio.Task[None]] = set()
        share_engine_sockets(self.directory)

    def sockets(self) -> list[socket.socket]:
        """The HTTP port (shared) and this process's private socket."""
        server = self.settings.server
        return [reuse_port_socket(server.host, server.port), unix_socket(os.path.join(self.directory, MAIN_SOCKET))]

    def follow(self, registry: ModelRegistry) -> None:
        self.version.write(registry.version)
        registry.listeners.append(self.version.write)

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        for index in range(1, self.count):
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        command = [
            sys.executable,
            "-m",
            "lmiserve.server.api_process",
            "--index",
            str(index),
            "--private-dir",
            self.directory,
            "--",
            *self.argv,
        ]
        process = ChildProcess(subprocess.Popen(command, env=child_env()))
        self.processes[index] = process
        log.info("API process %d started (pid %d)", index, process.pid)
        task = asyncio.create_task(self._watch(index, process), name=f"api-process-{index}")
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch(self, index: int, process: ChildProcess) -> None:
        code = await process.wait()
        if self.draining:
            return
        log.error("API process %d (pid %d) exited with status %s; starting it again", index, process.pid, code)
        await asyncio.sleep(RESTART_DELAY_S)
        if not self.draining:
            self._spawn(index)

    def begin_drain(self) -> None:
        """Tell every other process to drain (they refuse new requests, finish those in flight)."""
        if self.draining:
            return
        self.draining = True
        for process in self.processes.values():
            process.terminate()

    async def wait_drained(self, timeout: float) -> None:
        """Wait for the other processes to exit (killed after ``timeout`` seconds)."""
        self.begin_drain()
        await asyncio.gather(*(p.reap(max(timeout, 0.1)) for p in self.processes.values()), return_exceptions=True)

    async def close(self) -> None:
        await self.wait_drained(0.1)
        for task in list(self._watchers):
            task.cancel()
        self.version.close()
        self.remove_directory()

    def remove_directory(self) -> None:
        share_engine_sockets(None)
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- metrics ----------------------------------------------------------------------------
    async def collect_metrics(self) -> list[bytes]:
        """Each other process's own metrics (a process that does not answer is left out)."""

        async def one(index: int) -> bytes:
            transport = httpx.AsyncHTTPTransport(uds=process_socket(self.directory, index))
            async with httpx.AsyncClient(transport=transport, base_url="http://api", timeout=10) as client:
                response = await client.get("/metrics")
                response.raise_for_status()
                return response.content

        results = await asyncio.gather(*(one(i) for i in self.processes), return_exceptions=True)
        return [r for r in results if isinstance(r, bytes)]


class MainProcessMiddleware(ProcessHeader):
    """The main process: names itself on responses to clients; over its private socket, trusts
    the client address the other processes pass on, and describes its models."""

    def __init__(self, app: Any, registry: ModelRegistry):
        super().__init__(app, 0)
        self.registry = registry

    async def http(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if not private(scope):
            return await super().http(scope, receive, send)
        if scope["path"] == STATE_PATH:
            body = json.dumps(describe_models(self.registry)).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            return await send({"type": "http.response.body", "body": body})
        client = dict(scope["headers"]).get(CLIENT_HEADER)
        if client:
            host, _, port = client.decode("latin-1").rpartition(":")
            scope = {**scope, "client": (host, int(port or 0))}
        return await self.app(scope, receive, send)
