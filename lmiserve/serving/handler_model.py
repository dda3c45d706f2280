"""A model served by handler workers: the job queue, dynamic batching, worker scaling and restarts."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
from dataclasses import dataclass

from .. import wire
from ..child import child_env
from ..config import Settings
from ..errors import ModelNotReady, Overloaded
from .job_queue import JobQueue, QueueFull
from .response_stream import ResponseStream
from .snapshot import ModelSnapshot
from .worker_process import WorkerProcess, WorkerStartError

log = logging.getLogger("lmiserve.model")

MAX_START_FAILURES = 3


class ModelLoadError(Exception):
    pass


@dataclass(eq=False)
class Pending:
    item: wire.JobItem
    stream: ResponseStream


class HandlerModel:
    """Runs ``handle(inputs)`` in ``minWorkers``..``maxWorkers`` processes fed by one job queue."""

    kind = "handler"

    def __init__(self, settings: Settings, entry_point: str):
        self.settings = settings
        self.config = settings.model
        self.name = settings.model_name
        self.entry_point = entry_point
        self.queue: JobQueue[Pending] = JobQueue(self.config.job_queue_size)
        self.workers: list[WorkerProcess] = []
        self.failure: str | None = None
        self._ever_ready = False
        self._closing = False
        self._spawning = 0
        self._start_failures = 0
        self._worker_ids = itertools.count()
        self._job_ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self.running = 0
        """Requests handed to workers and not done yet."""
        self.first_load_timeout: float | None = None
        """The first workers' limit when a download took part of model_loading_timeout; later ones get it whole."""

    # --- state -------------------------------------------------------------------------
    @property
    def status(self) -> str:
        if self.failure is not None:
            return "Failed"
        if any(w.ready for w in self.workers):
            return "Healthy"
        return "Unhealthy" if self._ever_ready else "Loading"

    def _task(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- workers -----------------------------------------------------------------------
    def _init_message(self, worker_id: int) -> wire.InitWorker:
        return wire.InitWorker(
            model_name=self.name,
            model_dir=str(self.settings.model_dir),
            properties=self.settings.handler_properties(),
            entry_point=self.entry_point,
            handler=self.config.handler,
            worker_id=worker_id,
            log_level=self.settings.server.log_level,
        )

    async def _spawn(self) -> WorkerProcess:
        threads = max(1, (os.cpu_count() or 1) // self.config.max_workers)
        worker = WorkerProcess(self._init_message(next(self._worker_ids)), env=child_env(threads))
        self._spawning += 1
        try:
            await worker.start(timeout=self.first_load_timeout or self.config.model_loading_timeout)
        finally:
            self._spawning -= 1
        if self._closing:
            await worker.stop()
            raise WorkerStartError("the model is being stopped")
        worker.on_exit = self._on_worker_exit
        self.workers.append(worker)
        self._ever_ready = True
        log.info("model %s: worker %s ready (pid %s)", self.name, worker.worker_id, worker.pid)
        self._task(self._serve(worker))
        return worker

    async def start(self) -> None:
        """Start ``minWorkers`` workers; raise ModelLoadError if the model cannot be loaded."""
        results = await asyncio.gather(*(self._spawn() for _ in range(self.config.min_workers)), return_exceptions=True)
        self.first_load_timeout = None
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self.failure = str(errors[0])
            await self.stop()
            raise ModelLoadError(self.failure)

    def _on_worker_exit(self, worker: WorkerProcess) -> None:
        if worker in self.workers:
            self.workers.remove(worker)
        if self._closing or worker.stopping:
            return
        if len(self.workers) + self._spawning < self.config.min_workers:
            self._task(self._replace(delay=0.0))

    async def _replace(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._closing:
            return
        try:
            await self._spawn()
            self._start_failures = 0
        except WorkerStartError as exc:
            self._start_failures += 1
            log.error("model %s: a worker failed to start: %s", self.name, str(exc).splitlines()[0])
            if self._start_failures >= MAX_START_FAILURES and not self.workers:
                self.failure = str(exc)
                for pending in self.queue.drain():
                    pending.stream.fail(ModelNotReady(f"model {self.name} failed: {self.failure.splitlines()[0]}"))
                return
            self._task(self._replace(delay=min(30.0, 2.0**self._start_failures)))

    def _maybe_scale_up(self) -> None:
        if any(w.ready and not w.busy for w in self.workers):
            return
        if len(self.workers) + self._spawning < self.config.max_workers and len(self.queue) > 0:
            self._task(self._scale_up())

    async def _scale_up(self) -> None:
        try:
            await self._spawn()
        except WorkerStartError as exc:
            log.error("model %s: an extra worker failed to start: %s", self.name, str(exc).splitlines()[0])

    async def _serve(self, worker: WorkerProcess) -> None:
        while worker.alive and not self._closing:
            cfg = self.config  # read each time: the management API may scale the model
            extra = len(self.workers) > cfg.min_workers
            batch = await self.queue.get_batch(
                cfg.batch_size, cfg.max_batch_delay / 1000.0, idle_timeout=cfg.max_idle_time if extra else None
            )
            if not batch:
                if worker not in self.workers:  # scaled down
                    return
                if len(self.workers) > cfg.min_workers:
                    log.info(
                        "model %s: worker %s idle for %ss; stopping it", self.name, worker.worker_id, cfg.max_idle_time
                    )
                    self.workers.remove(worker)
                    await worker.stop()
                    return
                continue
            batch = [p for p in batch if not p.stream.finished]
            if not batch:
                continue
            if not worker.alive or worker not in self.workers:
                self.queue.put_front(batch)
                return
            self.running += len(batch)
            try:
                await worker.run(
                    next(self._job_ids),
                    [p.item for p in batch],
                    [p.stream for p in batch],
                    timeout=float(cfg.predict_timeout),
                )
            finally:
                self.running -= len(batch)

    async def scale(self, min_workers: int, max_workers: int, wait: bool = True) -> None:
        """Keep ``min_workers``..``max_workers`` workers: start missing ones now, and stop the
        ones beyond ``max_workers`` (idle ones first; a busy one finishes its job first)."""
        self.config = self.config.model_copy(update={"min_workers": min_workers, "max_workers": max_workers})
        self.settings = dataclasses.replace(self.settings, model=self.config)
        surplus = len(self.workers) - max_workers
        victims = sorted(self.workers, key=lambda w: w.busy)[: max(0, surplus)]
        for worker in victims:
            self.workers.remove(worker)
        work = [worker.stop(grace=float(self.config.predict_timeout)) for worker in victims]
        missing = min_workers - len(self.workers) - self._spawning
        work += [self._scale_up() for _ in range(max(0, missing))]
        log.info("model %s: scaling to %d..%d workers", self.name, min_workers, max_workers)
        if wait:
            await asyncio.gather(*work)
        else:
            for coro in work:
                self._task(coro)

    # --- requests ----------------------------------------------------------------------
    def submit(self, item: wire.JobItem) -> ResponseStream:
        if self.failure is not None:
            raise ModelNotReady(f"model {self.name} failed to load: {self.failure.splitlines()[0]}")
        stream = ResponseStream(item.request_id)
        try:
            self.queue.put_nowait(Pending(item, stream))
        except QueueFull as exc:
            raise Overloaded(f"model {self.name}: job queue is full ({exc}); retry later") from None
        self._maybe_scale_up()
        return stream

    async def answer(self, item: wire.JobItem) -> tuple[wire.ResponseHead, ResponseStream]:
        """Run ``item`` and wait for the head of its answer (the body follows on the stream);
        a caller that is cancelled while it waits drops the job."""
        stream = self.submit(item)
        try:
            return await stream.head, stream
        except asyncio.CancelledError:
            self.cancel(stream)
            raise

    def cancel(self, stream: ResponseStream) -> None:
        """Drop a request whose client has gone, if it is still waiting."""
        stream.finished = True

    async def stop(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.gather(*(w.stop() for w in list(self.workers)), return_exceptions=True)
        for pending in self.queue.drain():
            pending.stream.fail(ModelNotReady(f"model {self.name} is stopping"))
        self.workers.clear()

    def metrics_snapshot(self) -> ModelSnapshot:
        return ModelSnapshot(running=self.running, waiting=len(self.queue))

    def describe(self) -> dict[str, object]:
        return {
            "modelName": self.name,
            "status": self.status,
            "queueLength": len(self.queue),
            "workers": [
                {"id": w.worker_id, "pid": w.pid, "status": "READY" if w.ready else "LOADING", "busy": w.busy}
                for w in self.workers
            ],
        }
