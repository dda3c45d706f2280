"""One handler worker process as seen from the server: spawn, handshake, jobs, death."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

from .. import wire
from ..child import ChildProcess, exit_description, spawn
from ..errors import LmiServeError, PredictTimeout, WorkerDied
from .response_stream import ResponseStream

log = logging.getLogger("lmiserve.workers")


class WorkerStartError(Exception):
    """The worker exited or reported a failure while loading the model."""


class WorkerProcess:
    """A child process running :mod:`lmiserve.handlers.worker`, driven over a socket pair."""

    def __init__(self, init: wire.InitWorker, env: dict[str, str] | None = None):
        self.init = init
        self.worker_id = init.worker_id
        self.env = env
        self.process: ChildProcess | None = None
        self.ready = False
        self.busy = False
        self.last_activity = time.monotonic()
        self.started_at = time.monotonic()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._streams: dict[str, ResponseStream] = {}
        self._job_done: asyncio.Future[None] | None = None
        self._read_task: asyncio.Task[None] | None = None
        self._exit_reason: LmiServeError | None = None
        self.stopping = False
        self.exited = asyncio.Event()
        self.on_exit: Callable[[WorkerProcess], None] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None and not self.exited.is_set()

    async def start(self, timeout: float) -> None:
        """Spawn the process and wait until its handler has initialised."""
        self.process, self._reader, self._writer = await spawn("lmiserve.handlers.worker", self.env)
        wire.write(self._writer, self.init)
        try:
            first = await asyncio.wait_for(wire.read(self._reader), timeout)
        except TimeoutError:
            await self.kill()
            await self._reap()
            raise WorkerStartError(f"the model did not load within {timeout:.0f} s (model_loading_timeout)") from None
        if isinstance(first, wire.WorkerFailed):
            await self._reap()
            raise WorkerStartError(first.error)
        if not isinstance(first, wire.WorkerReady):
            code = await self._reap()
            raise WorkerStartError(f"the worker process exited while loading the model (exit status {code})")
        self.ready = True
        self.last_activity = time.monotonic()
        self._read_task = asyncio.create_task(self._read_loop(), name=f"worker-{self.worker_id}-reader")

    async def _reap(self) -> int | None:
        if self._writer is not None:
            self._writer.close()
        return await self.process.reap() if self.process is not None else None

    async def _read_loop(self) -> None:
        assert self._reader is not None
        while True:
            msg = await wire.read(self._reader)
            if msg is None:
                break
            self.last_activity = time.monotonic()
            if isinstance(msg, wire.ResponseHead):
                stream = self._streams.get(msg.request_id)
                if stream is not None:
                    stream.on_head(msg)
                    if not msg.streaming:
                        self._streams.pop(msg.request_id, None)
            elif isinstance(msg, wire.ResponseChunk):
                stream = self._streams.get(msg.request_id)
                if stream is not None:
                    stream.on_chunk(msg.data)
            elif isinstance(msg, wire.ResponseEnd):
                stream = self._streams.pop(msg.request_id, None)
                if stream is not None:
                    stream.on_end(None if msg.error is None else _StreamError(msg.error))
            elif isinstance(msg, wire.JobDone):
                if self._job_done is not None and not self._job_done.done():
                    self._job_done.set_result(None)
        await self._on_gone()

    async def _on_gone(self) -> None:
        code = await self.process.reap() if self.process is not None else None
        self.ready = False
        reason = self._exit_reason or WorkerDied(
            f"the worker process (pid {self.pid}) exited {exit_description(code)} while handling this request"
        )
        for stream in self._streams.values():
            stream.fail(reason)
        self._streams.clear()
        if self._job_done is not None and not self._job_done.done():
            self._job_done.set_result(None)
        if self._writer is not None:
            self._writer.close()
        self.exited.set()
        if self._exit_reason is None:
            log.warning("worker %s (pid %s) exited %s", self.worker_id, self.pid, exit_description(code))
        if self.on_exit is not None:
            self.on_exit(self)

    async def run(self, job_id: int, items: list[wire.JobItem], streams: list[ResponseStream], timeout: float) -> None:
        """Send one job and wait until the worker has answered every request in it.

        If the worker is silent for ``timeout`` seconds it is killed, and the job's
        unanswered requests fail with :class:`PredictTimeout`.
        """
        assert self._writer is not None
        self.busy = True
        self._job_done = asyncio.get_running_loop().create_future()
        for stream in streams:
            self._streams[stream.request_id] = stream
        self.last_activity = time.monotonic()
        wire.write(self._writer, wire.Job(job_id=job_id, items=items))
        try:
            await self._writer.drain()
            while not self._job_done.done():
                remaining = timeout - (time.monotonic() - self.last_activity)
                if remaining <= 0:
                    self._exit_reason = PredictTimeout(
                        f"the handler did not answer within {timeout:.0f} s (predict_timeout); its worker was restarted"
                    )
                    log.error(
                        "worker %s: job %s timed out after %.0f s; restarting it", self.worker_id, job_id, timeout
                    )
                    await self.kill()
                    await self.exited.wait()
                    break
                try:
                    await asyncio.wait_for(asyncio.shield(self._job_done), remaining)
                except TimeoutError:
                    pass
        except ConnectionError:
            await self.exited.wait()
        finally:
            self.busy = False
            self._job_done = None

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass

    async def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to exit after its current job; kill it after ``grace`` seconds."""
        self.stopping = True
        if self.process is None or self.process.returncode is not None:
            return
        self._exit_reason = WorkerDied("the model is being stopped")
        try:
            if self._writer is not None and not self._writer.is_closing():
                wire.write(self._writer, wire.Shutdown())
                await self._writer.drain()
        except ConnectionError:
            pass
        try:
            await asyncio.wait_for(self.process.wait(), grace)
        except TimeoutError:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()
        if self._read_task is not None:
            await asyncio.gather(self._read_task, return_exceptions=True)


class _StreamError(LmiServeError):
    kind = "handler"
    status = 424
    title = "invoke handler failure"
