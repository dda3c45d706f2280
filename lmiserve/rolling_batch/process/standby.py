"""A standby engine process: started after each engine start, so that the next start (a restart
after the engine died) finds Python, torch and the engine's modules already imported.

It is a child like the engine (it dies with the server) that waits for its first message; the
model's next engine start takes it (:meth:`Standby.take`) and sends it the usual
:class:`~lmiserve.wire.InitEngine`. One that dies while it waits is replaced; :meth:`Standby.close`
ends it with the model. This module imports no engine.
"""

from __future__ import annotations

import asyncio
import logging

from ...child import ChildProcess, exit_description, spawn

log = logging.getLogger("lmiserve.standby")

MODULE = "lmiserve.rolling_batch.process.standby_process"
REPLACE_DELAY_S = 1.0
"""How long after a standby died another is started."""
MAX_FAILURES = 3
"""Standbys that may die in a row, none taken meanwhile, before no other is started."""

Spawned = tuple[ChildProcess, asyncio.StreamReader, asyncio.StreamWriter]


class Standby:
    """At most one engine process waiting for its :class:`~lmiserve.wire.InitEngine`."""

    def __init__(self, architecture: str, env: dict[str, str] | None = None):
        self.architecture = architecture
        self.env = env
        self._waiting: Spawned | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The waiting process's pid; None while there is none."""
        waiting = self._waiting
        return waiting[0].pid if waiting is not None and waiting[0].returncode is None else None

    def refill(self) -> None:
        """Start a standby unless one waits or is starting."""
        if self._closed or self._failures >= MAX_FAILURES or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self._keep(), name="engine-standby")

    def take(self) -> Spawned | None:
        """The waiting process, now the caller's; None when none is alive."""
        waiting, self._waiting = self._waiting, None
        if waiting is None:
            return None
        if self._task is not None:  # it waits for this process to exit: no longer its business
            self._task.cancel()
            self._task = None
        if waiting[0].returncode is not None:
            waiting[2].close()
            return None
        self._failures = 0
        return waiting

    async def _keep(self) -> None:
        while not self._closed and self._failures < MAX_FAILURES:
            try:
                spawned = await spawn(MODULE, self.env, ["--standby", self.architecture])
            except OSError as exc:
                self._failures += 1
                log.warning("the standby engine process could not be started: %s", exc)
                await asyncio.sleep(REPLACE_DELAY_S)
                continue
            self._waiting = spawned
            if self._closed:
                break
            log.debug("standby engine process started (pid %s)", spawned[0].pid)
            code = await spawned[0].wait()
            self._waiting = None
            spawned[2].close()
            if self._closed:
                return
            self._failures += 1
            log.warning("the standby engine process (pid %s) exited %s", spawned[0].pid, exit_description(code))
            await asyncio.sleep(REPLACE_DELAY_S)
        await self._end_waiting()

    async def _end_waiting(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting[2].close()
            waiting[0].kill()
            await waiting[0].wait()

    async def close(self) -> None:
        """End the waiting process, and start no other."""
        self._closed = True
        await self._end_waiting()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
