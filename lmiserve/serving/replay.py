"""Requests that outlive their engine.

When the engine process dies, the requests it was running are handed to the restarted engine
(:class:`ReplayingStream`) instead of failing. One that has produced nothing yet starts again
from its prompt. One that has (a stream that already sent tokens) continues from them where the
engine can take them (:attr:`~lmiserve.rolling_batch.process.client.EngineClient.resumes`): the engine
then goes on exactly as it would have, greedy or seeded. Its reader sees a longer pause, not an
error. A request that arrives while the engine restarts waits for it the same way. Each request
is replayed at most ``option.max_replays`` times, and never past its deadline.

A crash is blamed on the requests that were starting in the engine when it died: sent to it,
nothing back yet. A request blamed for two consecutive crashes is taken for their cause (a
poison request): it ends with :class:`~lmiserve.errors.RequestPoisoned`, its id is logged and
it is counted. A request blamed once is replayed in quarantine, one such request at a time and
each only after the one before it got its first token back, so that a second crash is blamed on
it alone and not on the requests beside it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import msgspec

from .. import wire
from ..errors import RequestPoisoned, WorkerDied

log = logging.getLogger("lmiserve.model")

T = TypeVar("T")


@dataclass
class Replays:
    """A model's replays: their counts, and the quarantine of the requests blamed for a crash."""

    replayed: int = 0
    """Requests started again from their prompt on a restarted engine."""
    resumed: int = 0
    """Requests continued on a restarted engine from the tokens they had already generated."""
    poisoned: int = 0
    """Requests taken for the cause of two consecutive crashes, and ended."""
    quarantine: asyncio.Lock = field(default_factory=asyncio.Lock)

    def counts(self) -> dict[str, int]:
        return {"replayed": self.replayed, "resumed": self.resumed, "poisoned": self.poisoned}


class EngineWaiters:
    """The requests waiting for the next engine to start (a restart, or the model's end)."""

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[None]] = []
        self.count = 0

    async def wait(self) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures.append(future)
        self.count += 1
        try:
            await future
        finally:
            self.count -= 1

    def wake(self) -> None:
        """An engine started, or none will: every waiter looks again."""
        futures, self._futures = self._futures, []
        for future in futures:
            if not future.done():
                future.set_result(None)


class EngineSource(Protocol):
    """What a replaying stream needs of its model."""

    name: str
    replays: Replays
    max_replays: int

    async def engine_after(self, generation: int) -> tuple[Any, int]:
        """A live engine client newer than ``generation``, and its generation (waits for a
        restart; raises :class:`WorkerDied` if there will be none)."""
        ...


class ReplayingStream:
    """One request's deltas, in order, across engine restarts (the interface of
    :class:`~lmiserve.rolling_batch.process.client.RequestStream`: iterate it, ``ready``, ``fail``)."""

    def __init__(
        self,
        source: EngineSource,
        request_id: str,
        prompt_ids: list[int],
        params: wire.SamplingParams,
        adapter: str = "",
        deadline: float = 0.0,
        images: tuple[wire.ImageInput, ...] = (),
    ):
        self.source = source
        self.images = list(images)
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.adapter = adapter
        self.deadline = deadline
        self.generation = -1
        """The generation of the engine the request was last handed to."""
        self.tokens: list[int] = []
        """What the request generated so far (its one sequence)."""
        self.cumulative_logprob = 0.0
        self.delivered = False
        """Something reached the reader: a replay must then continue, not start again."""
        self.heard = False
        """Something came back from the engine the request was last handed to."""
        self.replays = 0
        self.blamed_at: int | None = None
        """The generation of the last engine whose crash was blamed on this request."""
        self._stream: Any = None
        self._iter: AsyncIterator[wire.SeqDelta] | None = None
        self._peeked: wire.SeqDelta | WorkerDied | None = None
        """The first delta of a quarantined replay (or the engine's death before it)."""
        self._error: Exception | None = None
        self._woken = asyncio.Event()
        self._died = WorkerDied("the engine died while handling this request")

    # --- the RequestStream interface ------------------------------------------------------
    def hand_to(self, client: Any, generation: int) -> None:
        """Give the request to ``client`` (raises what its ``submit`` raises)."""
        resume = self.delivered
        self._stream = client.submit(
            self.request_id,
            self.prompt_ids,
            msgspec.structs.replace(self.params, prompt_logprobs=None) if resume else self.params,
            self.adapter,
            output_ids=self.tokens if resume else None,
            cumulative_logprob=self.cumulative_logprob if resume else 0.0,
            deadline=self.deadline,
            images=self.images,
        )
        self._iter = self._stream.__aiter__()
        self.generation = generation
        self.heard = False

    @property
    def ready(self) -> bool:
        return self._peeked is not None or (self._stream is not None and self._stream.ready)

    def fail(self, error: Exception) -> None:
        """End the stream with ``error`` (a deadline), even while it waits for an engine."""
        if self._error is None:
            self._error = error
        self._woken.set()
        if self._stream is not None:
            self._stream.fail(error)

    async def __aiter__(self) -> AsyncIterator[wire.SeqDelta]:
        while True:
            if self._iter is None:
                await self._replay()  # raises when no engine will take the request
            try:
                if self._peeked is not None:
                    delta, self._peeked = self._peeked, None
                    if isinstance(delta, WorkerDied):
                        raise delta
                else:
                    assert self._iter is not None
                    delta = await self._iter.__anext__()
            except StopAsyncIteration:
                return
            except WorkerDied as died:
                self._after_crash(died)
                continue
            self._note(delta)
            yield delta

    # --- replays --------------------------------------------------------------------------
    def _note(self, delta: wire.SeqDelta) -> None:
        self.heard = self.delivered = True
        if delta.index == 0 and delta.error is None:
            self.tokens.extend(delta.token_ids)
            self.cumulative_logprob = delta.cumulative_logprob

    @property
    def single(self) -> bool:
        p = self.params
        return max(p.n, p.best_of, p.num_beams, 1) == 1

    def _after_crash(self, died: WorkerDied) -> None:
        """Decide, when the engine died under the request, whether it is replayed (raise if not)."""
        self._stream = self._iter = None
        if self._error is not None:
            raise self._error
        dead = self.generation
        if not self.heard:
            if self.blamed_at is not None and self.blamed_at == dead - 1:
                self.source.replays.poisoned += 1
                log.error(
                    "model %s: request %s was starting in the engine at two consecutive crashes; "
                    "it is taken for their cause and not run again",
                    self.source.name,
                    self.request_id,
                )
                raise RequestPoisoned(
                    "the engine crashed twice running while starting this request; it is taken for the "
                    "cause and not run again"
                ) from None
            self.blamed_at = dead
        if self.replays >= self.source.max_replays:
            log.warning(
                "model %s: request %s was replayed %d times; not again", self.source.name, self.request_id, self.replays
            )
            raise died
        if self.delivered and not self.single:
            raise died  # several sequences already streaming: nothing can continue them
        self._died = died
        self.replays += 1

    async def _replay(self) -> None:
        """Hand the request to a live engine newer than the last one; in quarantine (one at a
        time, until its first delta) when a crash was blamed on it."""
        lock = self.source.replays.quarantine
        while True:
            client, generation = await self._until(self.source.engine_after(self.generation))
            if self.delivered and not client.resumes:
                raise self._died
            if self.blamed_at is None:
                if self._handed(client, generation):
                    return
                continue
            await self._until(lock.acquire(), abandon=lambda _: lock.release())
            try:
                if not self._handed(client, generation):
                    continue
                assert self._iter is not None
                # its first delta (or the engine's death) comes before the next suspect goes in
                try:
                    self._peeked = await self._until(self._iter.__anext__())
                except WorkerDied as died:
                    self._peeked = died
                return
            finally:
                lock.release()

    def _handed(self, client: Any, generation: int) -> bool:
        """Whether the request went to ``client`` (False: it died meanwhile; wait for the next)."""
        replay = self.generation >= 0
        try:
            self.hand_to(client, generation)
        except WorkerDied:
            self.generation = generation
            return False
        if replay:
            if self.delivered:
                self.source.replays.resumed += 1
            else:
                self.source.replays.replayed += 1
            log.info(
                "model %s: request %s handed to the restarted engine (%s)",
                self.source.name,
                self.request_id,
                f"continuing after {len(self.tokens)} tokens" if self.delivered else "from its prompt",
            )
        return True

    async def _until(self, awaitable: Awaitable[T], abandon: Callable[[T], None] | None = None) -> T:
        """``awaitable``'s result, unless the stream is failed (or its reader cancelled) first:
        then that error is raised, and ``abandon`` is given a result that came too late."""
        task = asyncio.ensure_future(awaitable)
        woken = asyncio.ensure_future(self._woken.wait())
        try:
            await asyncio.wait({task, woken}, return_when=asyncio.FIRST_COMPLETED)
            if self._error is not None:
                raise self._error
            return task.result()
        except BaseException:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            elif abandon is not None and not task.cancelled() and task.exception() is None:
                abandon(task.result())
            raise
        finally:
            woken.cancel()
