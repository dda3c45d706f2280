"""Generation requests in flight: submitting them to an engine model and following their updates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import LmiServeError
from ..generation.output_processor import OutputProcessor
from ..generation.request import GenerationRequest, RequestOutput
from ..wire import SeqDelta
from .engine_model import EngineModel


class Observer(Protocol):
    """Sees every update of a request's generations, and their end (the metrics)."""

    def on_update(self, out: RequestOutput) -> None: ...

    def refused(self, reason: str) -> None: ...

    def close(self, outs: Iterable[RequestOutput], failed: bool) -> None: ...


@dataclass
class Generation:
    request_id: str
    processor: OutputProcessor
    stream: Any

    @property
    def output(self) -> RequestOutput:
        return self.processor.output


def submit_all(
    model: EngineModel, requests: list[GenerationRequest], budget: float | None = None, tenant: str | None = None
) -> list[Generation]:
    """Hand every request to the engine (each may take ``budget`` seconds, for ``tenant``); if one
    is refused, the ones already sent are aborted."""
    started: list[Generation] = []
    try:
        for req in requests:
            started.append(Generation(*model.submit(req, budget, tenant)))
    except LmiServeError:
        for g in started:
            model.abort(g.request_id)
        raise
    return started


async def updates(
    model: EngineModel, gens: list[Generation], observer: Observer | None = None
) -> AsyncIterator[tuple[int, RequestOutput, bool]]:
    """Updates of every generation as they happen, as ``(index, output, more)``; raises the
    first error. Each delta is applied just before its update is yielded, so the consumer sees
    every update in turn (and so does ``observer``, which keeps the metrics). ``more`` says
    that the next update has already arrived: a consumer that fell behind can write what it
    has for all of them at once. Closing the iterator (a client that went away) aborts
    whatever is still running."""
    if len(gens) == 1:  # one generation: its deltas in turn, without a task per delta
        async for update in _single(model, gens[0], observer):
            yield update
        return
    iterators = [g.stream.__aiter__() for g in gens]
    waiting = {asyncio.ensure_future(it.__anext__()): i for i, it in enumerate(iterators)}
    failed = False
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            ordered = sorted(done, key=lambda t: waiting[t])
            for n, task in enumerate(ordered):
                index = waiting.pop(task)
                try:
                    delta = task.result()
                except StopAsyncIteration:
                    continue
                g = gens[index]
                _apply(model, g, delta, observer)
                more = n + 1 < len(ordered) or any(x.stream.ready for x in gens)
                yield index, g.output, more
                if not g.output.finished:
                    waiting[asyncio.ensure_future(iterators[index].__anext__())] = index
    except Exception:
        failed = True
        raise
    finally:
        for task in waiting:
            task.cancel()
        _close(model, gens, observer, failed)


async def _single(
    model: EngineModel, g: Generation, observer: Observer | None
) -> AsyncIterator[tuple[int, RequestOutput, bool]]:
    """:func:`updates` of one generation."""
    failed = False
    try:
        async for delta in g.stream:
            _apply(model, g, delta, observer)
            yield 0, g.output, g.stream.ready
            if g.output.finished:
                break
    except Exception:
        failed = True
        raise
    finally:
        _close(model, [g], observer, failed)


def _apply(model: EngineModel, g: Generation, delta: SeqDelta, observer: Observer | None) -> None:
    """One delta into its generation's output (a stop string found ends that sequence in the engine)."""
    if g.processor.apply(delta):
        model.abort(g.request_id, delta.index)
    if observer is not None:
        observer.on_update(g.output)


def _close(model: EngineModel, gens: list[Generation], observer: Observer | None, failed: bool) -> None:
    """The end of :func:`updates`: the metrics closed, and whatever is still running aborted."""
    if observer is not None:
        observer.close((g.output for g in gens), failed)
    for g in gens:
        if not g.output.finished:
            model.abort(g.request_id)
