"""Stopping without dropping requests.

On SIGTERM (what SageMaker, Kubernetes and ``docker stop`` send) or Ctrl-C the server starts
draining: every new request, ``/ping`` included, is answered 503 at once (so a load balancer
takes the instance out), while the requests in flight, streaming or not, run to their end for up
to ``drain_timeout`` seconds. Then uvicorn closes the connections, the models stop (engine and
worker processes exit), and the process exits with status 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Iterator

import uvicorn

from .asgi import HttpMiddleware, refuse

log = logging.getLogger("lmiserve")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CONNECTION_CLOSE_GRACE_S = 3.0
"""What the other API processes get beyond the drain to close their connections and exit."""
REFUSAL = json.dumps(
    {"code": 503, "message": "Service Unavailable", "error": "the server is shutting down; retry on another instance"}
).encode()


class Drain:
    """Whether the server is draining, and how many HTTP requests are in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self.since: float | None = None
        self.in_flight_at_begin = 0
        """The requests in flight when draining began (the signal's moment, not the later one at
        which the server's loop gets to its shutdown)."""

    def begin(self) -> None:
        if not self.draining:
            self.draining = True
            self.since = time.monotonic()
            self.in_flight_at_begin = self.in_flight


class DrainMiddleware(HttpMiddleware):
    """Counts the HTTP requests in flight (a streamed response counts until its last byte; health
    checks on ``/ping`` do not) and refuses new ones with 503 and ``Connection: close`` once
    draining has begun."""

    def __init__(self, app, drain: Drain):  # type: ignore[no-untyped-def]
        super().__init__(app)
        self.drain = drain

    async def http(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if self.drain.draining:
            return await refuse(send, 503, REFUSAL, (b"retry-after", b"1"))
        if scope.get("path") == "/ping":  # a health check has nothing to drain: not counted
            return await self.app(scope, receive, send)
        self.drain.in_flight += 1
        counted = True

        def done() -> None:
            nonlocal counted
            if counted:
                counted = False
                self.drain.in_flight -= 1

        async def counting_send(message):  # type: ignore[no-untyped-def]
            # the last byte ends the request before it is sent: a client that has its whole answer
            # is never counted as in flight
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                done()
            await send(message)

        try:
            return await self.app(scope, receive, counting_send)
        finally:
            done()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with a drain before its own shutdown, and exit status 0 after a signal.

    uvicorn closes the listening socket as soon as it stops and then re-raises the signal it
    caught, so the process would end "killed by SIGTERM". Here the socket stays open while the
    requests in flight finish (new ones get 503), and the signal is not raised again.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_timeout: float, api_processes=None):  # type: ignore[no-untyped-def]
        super().__init__(config)
        self.drain = drain
        self.drain_timeout = drain_timeout
        self.stop_signal: str | None = None
        self.api_processes = api_processes
        """The other API processes (main process only): they drain at the same time, and the
        models stop only once they have exited."""

    def handle_exit(self, sig: int, frame) -> None:  # type: ignore[no-untyped-def]
        # runs in the main thread between two bytecodes: set flags only, log later
        if self.stop_signal is None:
            self.stop_signal = signal.Signals(sig).name
        self.drain.begin()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self.drain.begin()
        if self.api_processes is not None:
            self.api_processes.begin_drain()
        started = self.drain.since or time.monotonic()
        why = f"{self.stop_signal} received" if self.stop_signal else "stopping"
        if self.drain.in_flight_at_begin:
            log.info(
                "%s: draining %d request(s) in flight for up to %s s; new requests get 503",
                why,
                self.drain.in_flight_at_begin,
                self.drain_timeout,
            )
        elif self.stop_signal:
            log.info("%s: no request in flight; stopping", why)
        deadline = started + self.drain_timeout
        while self.drain.in_flight and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        if self.drain.in_flight:
            log.warning(
                "drain_timeout (%s s) reached: %d request(s) still in flight are cut off",
                self.drain_timeout,
                self.drain.in_flight,
            )
        elif self.stop_signal:
            log.info("drained in %.1f s", time.monotonic() - started)
        if self.api_processes is not None:  # their requests still need the engines
            await self.api_processes.wait_drained(deadline - time.monotonic() + CONNECTION_CLOSE_GRACE_S)
        await super().shutdown(sockets=sockets)
