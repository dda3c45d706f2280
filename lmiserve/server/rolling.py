"""LMI's rolling-batch schema on ``/invocations`` and ``/predictions``, over an engine model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from starlette.responses import Response, StreamingResponse

from ..errors import LmiServeError, ValidationFailed
from ..formatters import lmi_rolling
from ..generation.request import RequestOutput
from .bodies import read_body
from .engine_model import EngineModel


def defaults(model: EngineModel) -> lmi_rolling.Defaults:
    cfg = model.settings.model
    return lmi_rolling.Defaults(
        output_formatter=cfg.output_formatter, tgi_compat=cfg.tgi_compat, enable_streaming=cfg.enable_streaming
    )


async def wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(
    updates: AsyncIterator[RequestOutput], first: RequestOutput, request: Request
) -> RequestOutput | None:
    """The final output, or None if the client went away first (the request is then aborted)."""

    async def drain() -> RequestOutput:
        out = first
        async for update in updates:
            out = update
        return out

    consume = asyncio.ensure_future(drain())
    gone = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({consume, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not consume.done():
        consume.cancel()
        await asyncio.gather(consume, return_exceptions=True)
        await updates.aclose()  # type: ignore[attr-defined]
        return None
    return consume.result()


async def invoke_rolling(model: EngineModel, request: Request) -> Response:
    body = await read_body(request)
    req = None
    try:
        req = lmi_rolling.parse_request(body, defaults(model))
        updates = model.generate(req.generation)
        first = await updates.__anext__()
    except ValidationFailed as err:
        return Response(
            lmi_rolling.validation_error_body(err.detail), status_code=err.status, media_type=lmi_rolling.JSON
        )
    except StopAsyncIteration:
        return Response(lmi_rolling.generation_error_body(req), status_code=500, media_type=lmi_rolling.JSON)
    except LmiServeError as err:
        if req is None:
            raise
        return Response(lmi_rolling.generation_error_body(req), status_code=err.status, media_type=lmi_rolling.JSON)

    if req.stream:
        return StreamingResponse(_stream(req, first, updates), media_type=req.content_type)
    try:
        out = await collect(updates, first, request)
    except LmiServeError as err:
        return Response(lmi_rolling.generation_error_body(req), status_code=err.status, media_type=lmi_rolling.JSON)
    if out is None:
        return Response(status_code=499)
    if out.error is not None:
        return Response(lmi_rolling.generation_error_body(req), status_code=500, media_type=lmi_rolling.JSON)
    return Response(lmi_rolling.final_body(out, req), media_type=lmi_rolling.JSON)


async def _stream(
    req: lmi_rolling.ParsedRequest, first: RequestOutput, updates: AsyncIterator[RequestOutput]
) -> AsyncIterator[bytes]:
    try:
        out = first
        chunk = lmi_rolling.stream_chunks(out, req, first=True)
        if out.error is not None:
            yield lmi_rolling.stream_error_chunk(req, out.error)
            return
        if chunk:
            yield chunk
        async for out in updates:
            if out.error is not None:
                yield lmi_rolling.stream_error_chunk(req, out.error)
                return
            chunk = lmi_rolling.stream_chunks(out, req, first=False)
            if chunk:
                yield chunk
    except LmiServeError as err:
        yield lmi_rolling.stream_error_chunk(req, err.detail)
    finally:
        await updates.aclose()  # type: ignore[attr-defined]
