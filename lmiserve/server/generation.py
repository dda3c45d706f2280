"""Running generation requests for a route and answering in the route's protocol.

Every text-generation route works the same way: parse, submit one or more
:class:`GenerationRequest`s to the engine, then either stream each update through the
protocol's formatter or wait for the end and send one body. Protocol differences live in a
:class:`Responder` (in ``lmiserve.formatters``); HTTP concerns (status codes, disconnects,
headers) live here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
from starlette.responses import Response, StreamingResponse

from ..errors import GenerationError, LmiServeError, ValidationFailed
from ..generation.output_processor import OutputProcessor
from ..generation.request import GenerationRequest, RequestOutput
from . import deadline
from .engine_model import EngineModel
from .metrics import GenerationObserver, observe_generation


class Responder(Protocol):
    """A protocol's view of one HTTP request's generations (see lmiserve.formatters)."""

    stream: bool
    media_type: str

    def chunk(self, index: int, out: RequestOutput) -> bytes: ...

    def end(self, outs: list[RequestOutput]) -> bytes: ...

    def body(self, outs: list[RequestOutput]) -> bytes: ...

    def error_chunk(self, message: str) -> bytes: ...

    def error_body(self, err: LmiServeError) -> tuple[int, bytes]: ...


@dataclass
class Generation:
    request_id: str
    processor: OutputProcessor
    stream: Any

    @property
    def output(self) -> RequestOutput:
        return self.processor.output


def submit_all(model: EngineModel, requests: list[GenerationRequest]) -> list[Generation]:
    """Hand every request to the engine; if one is refused, the ones already sent are aborted."""
    started: list[Generation] = []
    try:
        for req in requests:
            started.append(Generation(*model.submit(req)))
    except LmiServeError:
        for g in started:
            model.abort(g.request_id)
        raise
    return started


async def updates(
    model: EngineModel, gens: list[Generation], observer: GenerationObserver | None = None
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Updates of every generation as they happen; raises the first error. Each delta is
    applied just before its update is yielded, so the consumer sees every update in turn
    (and so does ``observer``, which keeps the metrics). Closing the iterator (a client that
    went away) aborts whatever is still running."""
    iterators = [g.stream.__aiter__() for g in gens]
    waiting = {asyncio.ensure_future(it.__anext__()): i for i, it in enumerate(iterators)}
    failed = False
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: waiting[t]):
                index = waiting.pop(task)
                try:
                    delta = task.result()
                except StopAsyncIteration:
                    continue
                g = gens[index]
                if g.processor.apply(delta):
                    model.abort(g.request_id, delta.index)
                if observer is not None:
                    observer.on_update(g.output)
                yield index, g.output
                if not g.output.finished:
                    waiting[asyncio.ensure_future(iterators[index].__anext__())] = index
    except Exception:
        failed = True
        raise
    finally:
        for task in waiting:
            task.cancel()
        if observer is not None:
            observer.close((g.output for g in gens), failed)
        for g in gens:
            if not g.output.finished:
                model.abort(g.request_id)


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def output_error(out: RequestOutput) -> LmiServeError:
    """The error an output ended with: a refused request is a validation error."""
    message = out.error or "generation failed"
    return ValidationFailed(message) if out.error_kind == "validation" else GenerationError(message)


def timing_headers(outs: list[RequestOutput]) -> dict[str, str]:
    """TGI's timing headers: queue and inference time (ms), time per token, token counts."""
    if not outs:
        return {}
    arrival = min(o.arrival for o in outs)
    end = max(o.finished_at or o.arrival for o in outs)
    queue_ms = max((o.queue_us[0] if o.queue_us else 0) for o in outs) / 1000
    generated = sum(o.generated_tokens for o in outs)
    total_ms = (end - arrival) * 1000
    inference_ms = max(0.0, total_ms - queue_ms)
    return {
        "x-queue-time": str(int(queue_ms)),
        "x-inference-time": str(int(inference_ms)),
        "x-time-per-token": str(int(inference_ms / generated)) if generated else "0",
        "x-prompt-tokens": str(sum(len(o.prompt_token_ids) for o in outs)),
        "x-generated-tokens": str(generated),
    }


async def respond(
    model: EngineModel, requests: list[GenerationRequest], responder: Responder, request: Request
) -> Response:
    """Run ``requests`` and answer with ``responder``'s protocol, within the request's deadline."""
    observer = observe_generation(request, model.name)
    try:
        seconds = deadline.budget(request, float(model.settings.model.predict_timeout))
        gens = submit_all(model, requests)
    except LmiServeError as err:
        return _error(responder, err)
    clock = asyncio.get_running_loop()
    ends = clock.time() + seconds
    stream = updates(model, gens, observer)
    outs = [g.output for g in gens]
    if hasattr(responder, "start"):
        responder.start(outs)  # a responder that reports on all outputs (usage in every chunk)
    if responder.stream:
        try:
            first = await asyncio.wait_for(stream.__anext__(), ends - clock.time())
        except StopAsyncIteration:
            first = None
        except TimeoutError:
            await stream.aclose()
            if getattr(responder, "truncate_on_timeout", False):
                return StreamingResponse(_truncated_stream(responder, outs), media_type=responder.media_type)
            return _error(responder, deadline.expired(outs, seconds))
        except LmiServeError as err:
            return _error(responder, err)
        if first is not None and first[1].error is not None:  # refused before the first byte
            await stream.aclose()
            status, body = responder.error_body(output_error(first[1]))
            return Response(body, status_code=status, media_type=_error_media_type(responder))
        body = _stream(responder, stream, first, outs, (ends, seconds))
        return StreamingResponse(body, media_type=responder.media_type)

    consume = asyncio.ensure_future(_drain(stream))
    gone = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({consume, gone}, timeout=ends - clock.time(), return_when=asyncio.FIRST_COMPLETED)
    finally:
        left = gone.done()
        gone.cancel()
    if not consume.done():
        consume.cancel()
        await asyncio.gather(consume, return_exceptions=True)
        await stream.aclose()
        if left:
            return Response(status_code=499)
        if getattr(responder, "truncate_on_timeout", False):
            truncate(outs)
            return Response(responder.body(outs), media_type="application/json", headers=timing_headers(outs))
        return _error(responder, deadline.expired(outs, seconds))
    err = consume.exception()
    if isinstance(err, LmiServeError):
        return _error(responder, err)
    if err is not None:
        raise err
    failed = next((o for o in outs if o.error is not None), None)
    if failed is not None:
        status, body = responder.error_body(output_error(failed))
        return Response(body, status_code=status, media_type="application/json")
    return Response(responder.body(outs), media_type="application/json", headers=timing_headers(outs))


def _error_media_type(responder: Responder) -> str:
    """JSON, unless the protocol answers a refused stream in the stream's own framing (LMI)."""
    return getattr(responder, "error_media_type", "application/json")


def _error(responder: Responder, err: LmiServeError) -> Response:
    status, body = responder.error_body(err)
    return Response(body, status_code=status, media_type=_error_media_type(responder), headers=err.headers)


def truncate(outs: list[RequestOutput]) -> None:
    """End every unfinished sequence where it is, as if it had reached its length."""
    for out in outs:
        for seq in out.sequences:
            if seq.finish_reason is None:
                seq.finish_reason = "length"
                seq.new_tokens = []


async def _truncated_stream(responder: Responder, outs: list[RequestOutput]) -> AsyncIterator[bytes]:
    """The end of a stream whose time ran out: each unfinished sequence ends with ``length``."""
    for index, out in enumerate(outs):
        for seq in out.sequences:
            if seq.finish_reason is None:
                seq.finish_reason, seq.new_tokens = "length", []
                out.last_index = seq.index
                data = responder.chunk(index, out)
                if data:
                    yield data
    tail = responder.end(outs)
    if tail:
        yield tail


async def _drain(stream: AsyncIterator[tuple[int, RequestOutput]]) -> None:
    async for _ in stream:
        pass


async def _stream(
    responder: Responder,
    stream: AsyncIterator[tuple[int, RequestOutput]],
    first: tuple[int, RequestOutput] | None,
    outs: list[RequestOutput],
    ends: tuple[float, float],
) -> AsyncIterator[bytes]:
    """The streamed body; ``ends`` is the deadline (loop time) and its length in seconds."""
    clock = asyncio.get_running_loop()
    try:
        pending = [first] if first is not None else []
        while True:
            for index, out in pending:
                if out.error is not None:
                    yield responder.error_chunk(out.error)
                    return
                data = responder.chunk(index, out)
                if data:
                    yield data
            try:
                pending = [await asyncio.wait_for(stream.__anext__(), ends[0] - clock.time())]
            except StopAsyncIteration:
                break
            except TimeoutError:
                if getattr(responder, "truncate_on_timeout", False):
                    async for data in _truncated_stream(responder, outs):
                        yield data
                    return
                yield responder.error_chunk(deadline.expired(outs, ends[1]).detail)
                return
        tail = responder.end(outs)
        if tail:
            yield tail
    except LmiServeError as err:
        yield responder.error_chunk(err.detail)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
