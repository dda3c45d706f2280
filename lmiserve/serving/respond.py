"""Answering generation requests in a protocol, whatever the transport.

Every text-generation answer works the same way: submit one or more
:class:`GenerationRequest`\\ s to the engine, then either stream each update through the
protocol's :class:`Responder` or wait for the end and send one body, within the request's
deadline and for as long as the client stays. :func:`respond` does this for every protocol
(LMI, TGI, MindIE, OpenAI, Databricks, KServe V2, Bedrock, a model's own output formatter) and
returns a transport-neutral :class:`Reply`; HTTP turns it into a response, gRPC into a message.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import GenerationError, LmiServeError, Overloaded, PredictTimeout, ValidationFailed
from ..formatters.responder import JSON, Responder
from ..generation.request import GenerationRequest, RequestOutput
from .in_flight import Generation, Observer, submit_all, updates

CLIENT_GONE = 499  # nginx's status for a client that closed the connection before the answer
COALESCE_MAX = 64
"""The most updates a lagging stream joins into one write."""


@dataclass
class Reply:
    """An answer: one body, or (``chunks`` set) a stream of them after the status."""

    status: int = 200
    body: bytes = b""
    media_type: str | None = JSON
    """None: what ``headers`` say (a handler's own answer)."""
    headers: dict[str, str] = field(default_factory=dict)
    chunks: AsyncIterator[bytes] | None = None


class DeadlinePassed(Exception):
    """The request's time ran out before every output finished."""


def expired(outs: Iterable[RequestOutput], seconds: float) -> LmiServeError:
    """The error of a request whose deadline passed: 503 when it never produced a token (it was
    shed from the queue rather than served late), 504 otherwise."""
    if not any(o.generated_tokens for o in outs):
        return Overloaded(f"the request waited {seconds:g} s (its deadline) without being scheduled; retry later")
    return PredictTimeout(f"the request did not finish within its deadline of {seconds:g} s; generation was aborted")


def output_error(out: RequestOutput) -> LmiServeError:
    """The error an output ended with: a refused request is a validation error; one the engine
    shed from its queue at the request's deadline is the 503 of :func:`expired` (the engine's
    clock can pass the deadline before this process's timer fires)."""
    message = out.error or "generation failed"
    if out.error_kind == "validation":
        return ValidationFailed(message)
    if out.error_kind == "deadline":
        return Overloaded(f"{message}; retry later")
    return GenerationError(message)


def truncate(outs: list[RequestOutput]) -> None:
    """End every unfinished sequence where it is, as if it had reached its length."""
    for out in outs:
        for seq in out.sequences:
            if seq.finish_reason is None:
                seq.finish_reason = "length"
                seq.new_tokens = []


async def truncated_stream(responder: Responder, outs: list[RequestOutput]) -> AsyncIterator[bytes]:
    """The end of a stream whose time ran out: each unfinished sequence ends with ``length``."""
    for index, out in enumerate(outs):
        for seq in out.sequences:
            if seq.finish_reason is None:
                seq.finish_reason, seq.new_tokens = "length", []
                out.last_index = seq.index
                if data := responder.chunk(index, out):
                    yield data
    if tail := responder.end(outs):
        yield tail


def error_reply(responder: Responder, err: LmiServeError) -> Reply:
    status, body = responder.error_body(err)
    return Reply(status, body, responder.error_media_type, dict(err.headers or {}))


async def run_to_end(
    model: Any,
    gens: list[Generation],
    seconds: float,
    observer: Observer | None = None,
    disconnected: Callable[[], Awaitable[None]] | None = None,
    on_update: Callable[[int, RequestOutput], None] | None = None,
) -> list[RequestOutput] | None:
    """Every output of ``gens`` once all have finished; None when the client went away first.
    Raises :class:`DeadlinePassed` after ``seconds`` (what ran is aborted) and the first error."""
    stream = updates(model, gens, observer)

    async def drain() -> None:
        async for index, out, _ in stream:
            if on_update is not None:
                on_update(index, out)

    consume = asyncio.ensure_future(drain())
    gone = asyncio.ensure_future(disconnected()) if disconnected is not None else None
    try:
        waits = {consume} if gone is None else {consume, gone}
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if gone is not None:
            left = gone.done()
            gone.cancel()
        else:
            left = False
        if not consume.done():
            consume.cancel()
            await asyncio.gather(consume, return_exceptions=True)
            await stream.aclose()
    if not consume.done() or consume.cancelled():
        if left:
            return None
        raise DeadlinePassed
    err = consume.exception()
    if err is not None:
        raise err
    return [g.output for g in gens]


async def respond(
    model: Any,
    requests: list[GenerationRequest],
    responder: Responder,
    seconds: float,
    observer: Observer | None = None,
    disconnected: Callable[[], Awaitable[None]] | None = None,
    tenant: str | None = None,
) -> Reply:
    """Run ``requests`` and answer in ``responder``'s protocol within ``seconds``; a request whose
    client goes away (``disconnected`` returns) is aborted. ``tenant``: who sent them, where the
    requests in flight are shared fairly among tenants."""
    try:
        media = getattr(model, "media", None)
        if media is not None and any(r.media or r.markdown_images for r in requests):
            await media.prepare(requests)  # the pictures fetched and decoded before admission
        gens = submit_all(model, requests, seconds, tenant)
    except LmiServeError as err:
        if isinstance(err, Overloaded) and observer is not None:
            observer.refused(err.reason)
        return error_reply(responder, err)
    outs = [g.output for g in gens]
    responder.start(outs)
    if responder.stream:
        return await _streamed(model, gens, responder, seconds, observer)
    try:
        done = await run_to_end(model, gens, seconds, observer, disconnected, responder.collect)
    except DeadlinePassed:
        if not responder.truncate_on_timeout:
            return error_reply(responder, expired(outs, seconds))
        truncate(outs)
    except LmiServeError as err:
        return error_reply(responder, err)
    else:
        if done is None:
            return Reply(status=CLIENT_GONE)
        failed = next((o for o in outs if o.error is not None), None)
        if failed is not None:
            return error_reply(responder, output_error(failed))
    body = responder.body(outs)
    return Reply(body=body, media_type=responder.body_media_type, headers=responder.headers(outs))


def _expire_at(ends: float, gens: list[Generation]) -> asyncio.TimerHandle:
    """At loop time ``ends``, every generation still running reads :class:`DeadlinePassed` after
    what it already received: one timer per request, not a timeout per delta."""

    def expire() -> None:
        for g in gens:
            if not g.output.finished:
                g.stream.fail(DeadlinePassed())

    return asyncio.get_running_loop().call_at(ends, expire)


async def _streamed(
    model: Any, gens: list[Generation], responder: Responder, seconds: float, observer: Observer | None
) -> Reply:
    """The status waits for the first update (for a ``hold_headers`` responder, the first one
    with something to send): an error before it is an error status."""
    ends = asyncio.get_running_loop().time() + seconds
    timer = _expire_at(ends, gens)
    outs = [g.output for g in gens]
    stream = updates(model, gens, observer)
    hold = responder.hold_headers
    head: list[bytes] = []
    chunks = None  # the body, which then owns the timer
    try:
        while True:
            try:
                index, out, _ = await stream.__anext__()
            except StopAsyncIteration:
                break
            if out.error is not None:  # refused before the first byte
                await stream.aclose()
                return error_reply(responder, output_error(out))
            data = responder.chunk(index, out)
            if data:
                head.append(data)
            if not hold or data or out.finished:
                break
        chunks = _chunks(responder, stream, head, outs, seconds, timer)
        return Reply(media_type=responder.media_type, chunks=chunks)
    except DeadlinePassed:
        await stream.aclose()
        if responder.truncate_on_timeout:
            return Reply(media_type=responder.media_type, chunks=truncated_stream(responder, outs))
        return error_reply(responder, expired(outs, seconds))
    except LmiServeError as err:
        await stream.aclose()
        return error_reply(responder, err)
    finally:
        if chunks is None:
            timer.cancel()


async def _chunks(
    responder: Responder,
    stream: AsyncIterator[tuple[int, RequestOutput, bool]],
    head: list[bytes],
    outs: list[RequestOutput],
    seconds: float,
    timer: asyncio.TimerHandle,
) -> AsyncIterator[bytes]:
    """The streamed body; ``timer`` ends it after ``seconds`` (see :func:`_expire_at`).

    A client that falls behind the engine gets the lines or events of every update that has
    already arrived in one write: the same bytes in fewer, larger pieces."""
    pending: list[bytes] = []
    try:
        if head:
            yield b"".join(head)
        async for index, out, more in stream:
            if out.error is not None:
                pending.append(responder.error_chunk(out.error))
                break
            data = responder.chunk(index, out)
            if data:
                pending.append(data)
            if pending and (not more or len(pending) >= COALESCE_MAX):
                yield b"".join(pending)
                pending.clear()
        else:
            if tail := responder.end(outs):
                pending.append(tail)
    except DeadlinePassed:
        if responder.truncate_on_timeout:
            async for data in truncated_stream(responder, outs):
                pending.append(data)
        else:
            pending.append(responder.error_chunk(expired(outs, seconds).detail))
    except LmiServeError as err:
        pending.append(responder.error_chunk(err.detail))
    finally:
        timer.cancel()
        await stream.aclose()  # type: ignore[attr-defined]
    if pending:
        yield b"".join(pending)
