"""The API process's handle on an engine: submit token ids, receive per-step deltas.

:class:`EngineClient` is the interface; :class:`ProcessEngineClient` runs our engine in a child
process (model compute never waits on JSON, and a crash is contained). The other transports
build on it: ``engine_process.InProcessEngineClient`` (our engine on a thread of this process)
and ``vllm.adapter.VllmEngineClient``. This module imports no engine.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable

from ... import wire
from ...child import EXIT_GRACE_S, ChildProcess, exit_description, spawn
from ...errors import WorkerDied
from .standby import Spawned

log = logging.getLogger("lmiserve.engine_client")


class EngineStartError(Exception):
    pass


class RequestStream:
    """Deltas of one request, in order, until each of its sequences has finished."""

    def __init__(self, request_id: str, sequences: int):
        self.request_id = request_id
        self._pending = set(range(sequences))
        self._queue: asyncio.Queue[wire.SeqDelta | Exception] = asyncio.Queue()
        self.done = False
        self.ended_in_engine = False
        """Every sequence finished in the engine (``done`` alone may be this side's doing: a
        deadline, a dead engine; the engine then still runs it until aborted)."""

    def put(self, delta: wire.SeqDelta) -> None:
        if self.ended_in_engine:
            return
        if delta.error is not None:
            self._pending.clear()
        elif delta.finish_reason is not None:
            self._pending.discard(delta.index)
        if not self.done:
            self._queue.put_nowait(delta)
        if not self._pending:
            self.done = self.ended_in_engine = True

    def fail(self, error: Exception) -> None:
        """End the stream with ``error``, raised to its reader after the deltas already queued
        (an engine that died, a deadline that passed)."""
        if not self.done:
            self.done = True
            self._queue.put_nowait(error)

    @property
    def ready(self) -> bool:
        """Something has arrived that the reader has not taken yet."""
        return not self._queue.empty()

    async def __aiter__(self) -> AsyncIterator[wire.SeqDelta]:
        while True:
            item = await self._queue.get()
            if isinstance(item, Exception):
                raise item
            yield item
            if self.done and self._queue.empty():
                return


class EngineClient:
    """Routing of deltas to request streams; transports implement ``_send`` and ``start``/``stop``."""

    def __init__(self) -> None:
        self.streams: dict[str, RequestStream] = {}
        self.info: dict[str, str | int | float] = {}
        self.stats: wire.EngineStats | None = None
        self.alive = False
        self.on_exit: Callable[[EngineClient, str], None] | None = None
        self.on_deltas: Callable[[list[wire.SeqDelta]], None] | None = None
        """Sees each step's deltas, in order, before they reach their requests (the text of the
        whole step is decoded at once there)."""
        self.last_progress = time.monotonic()
        """When the engine last reported a step (see ``engine_process.HEARTBEAT_SECONDS``)."""
        self._op_ids = itertools.count(1)
        self._ops: dict[int, asyncio.Future[wire.AdapterResult]] = {}

    def _send(self, msg: wire.Msg) -> None:
        raise NotImplementedError

    resumes = False
    """Whether the engine continues a request from the tokens it already generated
    (``GenerateRequest.output_ids``): our engine does."""

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: wire.SamplingParams,
        adapter: str = "",
        *,
        output_ids: list[int] | None = None,
        cumulative_logprob: float = 0.0,
        deadline: float = 0.0,
        images: list[wire.ImageInput] | tuple[wire.ImageInput, ...] = (),
    ) -> RequestStream:
        """Hand a request to the engine; ``output_ids`` (where :attr:`resumes`) continues one that a
        dead engine had started, and ``deadline`` (``time.monotonic()``) is when it stops being
        worth starting."""
        if not self.alive:
            raise WorkerDied("the engine is not running")
        if not self.streams:  # an idle engine owes no progress: count from the first request
            self.last_progress = time.monotonic()
        stream = RequestStream(request_id, max(params.best_of, params.n, 1))
        self.streams[request_id] = stream
        self._send(
            wire.GenerateRequest(
                request_id=request_id,
                prompt_ids=prompt_ids,
                params=params,
                adapter=adapter,
                output_ids=list(output_ids or []),
                cumulative_logprob=cumulative_logprob,
                deadline=deadline,
                images=list(images),
            )
        )
        return stream

    async def adapter_command(
        self, action: str, name: str, src: str = "", preload: bool | None = None, pin: bool | None = None
    ) -> wire.AdapterResult:
        """Register, update or unregister an adapter in the engine, between two of its steps."""
        if not self.alive:
            raise WorkerDied("the engine is not running")
        op_id = next(self._op_ids)
        answer: asyncio.Future[wire.AdapterResult] = asyncio.get_running_loop().create_future()
        self._ops[op_id] = answer
        self._send(wire.AdapterCommand(op_id=op_id, action=action, name=name, src=src, preload=preload, pin=pin))
        return await answer

    def _on_adapter_result(self, result: wire.AdapterResult) -> None:
        answer = self._ops.pop(result.op_id, None)
        if answer is not None and not answer.done():
            answer.set_result(result)

    def abort(self, request_id: str, index: int | None = None) -> None:
        stream = self.streams.get(request_id)
        if index is None:
            self.streams.pop(request_id, None)
        if self.alive and (stream is not None and not stream.ended_in_engine):
            self._send(wire.AbortRequest(request_ids=[request_id], index=index))

    def _on_step(self, step: wire.EngineStep) -> None:
        self.last_progress = time.monotonic()
        if step.stats is not None:
            self.stats = step.stats
        if self.on_deltas is not None and step.deltas:
            try:
                self.on_deltas(step.deltas)
            except Exception:  # noqa: BLE001 - the requests then decode their own text
                log.exception("processing a step's deltas failed")
        for delta in step.deltas:
            stream = self.streams.get(delta.request_id)
            if stream is None:
                continue
            stream.put(delta)
            if stream.ended_in_engine:
                self.streams.pop(delta.request_id, None)

    def _gone(self, reason: str, restart: bool | None = None) -> None:
        was_alive = self.alive if restart is None else restart
        self.alive = False
        error = WorkerDied(reason)
        for stream in self.streams.values():
            stream.fail(error)
        self.streams.clear()
        for answer in self._ops.values():
            if not answer.done():
                answer.set_exception(error)
        self._ops.clear()
        if was_alive and self.on_exit is not None:
            self.on_exit(self, reason)


class SocketEngineClient(EngineClient):
    """An engine at the other end of a stream socket: messages written to it, and read from it
    until it closes."""

    def __init__(self) -> None:
        super().__init__()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self.stopping = False

    def _close_connection(self) -> None:
        """Close our end of the engine's socket. A transport left to the garbage collector is
        closed there, in whichever thread collects it, and uvloop then closes its descriptor
        twice: the number may meanwhile belong to a connection just accepted."""
        if self._writer is not None:
            self._writer.close()

    def _send(self, msg: wire.Msg) -> None:
        if self._writer is None or self._writer.is_closing():
            raise WorkerDied("the engine is not running")
        wire.write(self._writer, msg)

    async def _receive(self, reader: asyncio.StreamReader) -> None:
        """Route every step and adapter answer from ``reader`` until the engine closes it."""
        while (msg := await wire.read(reader)) is not None:
            if isinstance(msg, wire.EngineStep):
                self._on_step(msg)
            elif isinstance(msg, wire.AdapterResult):
                self._on_adapter_result(msg)


class ProcessEngineClient(SocketEngineClient):
    """The engine in a child process. With ``heartbeat_timeout`` (seconds), an engine that reports
    no step for that long while requests are in flight is taken for hung: it is marked not alive
    at once, killed, and its requests end with an error (then the model restarts it)."""

    resumes = True

    def __init__(self, init: wire.InitEngine, env: dict[str, str] | None = None, heartbeat_timeout: float = 0):
        super().__init__()
        self.init = init
        self.env = env
        self.heartbeat_timeout = heartbeat_timeout
        self._stall: str | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self.process: ChildProcess | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(self, timeout: float, spawned: Spawned | None = None) -> None:
        """Start the engine: in ``spawned``, a process already started that waits for its
        :class:`~lmiserve.wire.InitEngine` (a :class:`~.standby.Standby`'s), else in a new one."""
        if spawned is None:
            spawned = await spawn("lmiserve.rolling_batch.process.engine_process", self.env)
        self.process, reader, self._writer = spawned
        wire.write(self._writer, self.init)
        try:
            first = await asyncio.wait_for(wire.read(reader), timeout)
        except TimeoutError:
            self._close_connection()
            self.process.kill()
            await self.process.wait()
            raise EngineStartError(f"the engine did not start within {timeout:.0f} s (model_loading_timeout)") from None
        if not isinstance(first, wire.EngineReady):
            self._close_connection()
            code = await self.process.wait()
            if isinstance(first, wire.EngineFailed):
                raise EngineStartError(first.error)
            raise EngineStartError(f"the engine process exited while starting {exit_description(code)}")
        self.info = dict(first.info)
        self.alive = True
        self.last_progress = time.monotonic()
        self._reader_task = asyncio.create_task(self._read(reader), name="engine-reader")
        if self.heartbeat_timeout > 0:
            self._watchdog = asyncio.create_task(self._watch(), name="engine-watchdog")

    async def _watch(self) -> None:
        period = min(1.0, self.heartbeat_timeout / 4)
        while self.alive:
            await asyncio.sleep(period)
            silent = time.monotonic() - self.last_progress
            if self.alive and self.streams and silent > self.heartbeat_timeout:
                self._stall = (
                    f"the engine made no progress for {silent:.0f} s (engine_heartbeat_timeout); it is being restarted"
                )
                log.error("the engine process (pid %s) is stalled: no step for %.0f s; killing it", self.pid, silent)
                self.alive = False  # /ping stops saying healthy at once
                self.kill()
                return

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            await self._receive(reader)
        finally:
            self._close_connection()
        code = await self.process.reap() if self.process is not None else None
        if not self.stopping and self._stall is None:
            log.error("the engine process (pid %s) exited %s", self.pid, exit_description(code))
        reason = self._stall or f"the engine process exited {exit_description(code)} while handling this request"
        self._gone(reason, restart=self.alive or self._stall is not None)

    async def stop(self, grace: float = 2 * EXIT_GRACE_S) -> None:
        self.stopping = True
        self.alive = False
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.process is None or self.process.returncode is not None:
            return
        try:
            self._send(wire.Shutdown())
            await self._writer.drain()  # type: ignore[union-attr]
        except (ConnectionError, WorkerDied):
            pass
        await self.process.reap(grace)
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
