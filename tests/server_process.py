"""Starting the real lmiserve server as a child process on 127.0.0.1 for tests."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def serving_dir(root: Path, properties: str) -> Path:
    """A model directory that holds only ``serving.properties`` (the weights are elsewhere)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "serving.properties").write_text(properties)
    return root


def sse_data(body: bytes, space: bool = False) -> list[str]:
    """The data of each server-sent event, the framing checked byte for byte."""
    assert body.endswith(b"\n\n")
    prefix = "data: " if space else "data:"
    events = body.decode().split("\n\n")[:-1]
    assert all(e.startswith(prefix) and "\n" not in e for e in events), events
    return [e[len(prefix) :].strip() for e in events]


PORTS = range(10000, 30000)
"""Where test servers listen: below Linux's ephemeral range (32768 and up), so no socket that
binds port 0 or connects out is ever handed a port a test server is about to take."""
_pick = random.Random()  # its own generator: a test that seeds ``random`` does not fix the ports


def free_port() -> int:
    """A free port of :data:`PORTS`, picked at random. Under pytest-xdist each worker picks in a
    slice of its own, so two workers never pick the same port between the check and the server
    binding it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker[2:]) % workers if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = len(PORTS) // workers
    first = PORTS.start + index * size
    for _ in range(1000):
        port = _pick.randrange(first, first + size)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {first}..{first + size - 1}")


class ServerProcess:
    started: list[ServerProcess] = []
    """Every server started: a failing test's report ends with the logs of those running when it
    failed or stopped while it ran (``stopped_at``)."""

    def __init__(self, model_dir: Path, env: dict[str, str] | None = None, args: list[str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_dir = model_dir
        self.log_path = model_dir.parent / f"server-{self.port}.log"
        full_env = dict(os.environ)
        # each test server gets a gRPC port of its own (the default 8081 may be taken by another)
        full_env.setdefault("SERVING_GRPC_PORT", str(free_port()))
        # one API process whatever the CPUs, unless a test asks for more (tests/integration/test_api_processes.py)
        full_env.setdefault("SERVING_API_PROCESSES", "1")
        # no standby engine process competing for the cores, unless a test asks for one
        # (tests/integration/test_engine_standby.py, the chaos soak)
        full_env.setdefault("OPTION_ENGINE_STANDBY", "false")
        full_env.update(env or {})
        cmd = [
            sys.executable,
            "-m",
            "lmiserve",
            "serve",
            "--model-dir",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *(args or []),
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)
        self.stopped_at: float | None = None
        """``time.time()`` when :meth:`stop` ran (None: running)."""
        ServerProcess.started.append(self)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with self.client(timeout=2) as c:  # a subclass's client (TLS) is the one that asks
                    if c.get("/ping").status_code == 200:
                        return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def wait_exit(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout)

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 120), **kwargs)

    def hang_up_stream(self, path: str, body: dict, while_open: Callable[[], None]) -> None:
        """Read a streaming response's first two lines, call ``while_open``, then disconnect."""
        with self.client() as c, c.stream("POST", path, json=body) as r:
            lines = r.iter_lines()
            next(lines)
            next(lines)
            while_open()

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def stop(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
