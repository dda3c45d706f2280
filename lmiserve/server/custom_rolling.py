"""The rolling-batch path with a model's custom input and/or output formatter.

The input formatter (if any) turns the request into an LMI request; the output formatter (if
any) is called with a :class:`~lmiserve.formatters.request_io.TextGenerationOutput` at every
update and what it returns is sent: each non-empty piece as it comes when streaming, all of them
joined into one body otherwise. A formatter that raises ends that request with LMI's 424 error
payload ``{"error": ..., "code": 424}`` (as the status before the first byte, as the last line
after it); other requests are not affected.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response, StreamingResponse

from ..errors import BadRequest, LmiServeError, ValidationFailed
from ..formatters import custom_input, lmi_rolling
from ..formatters.request_io import TextInput, generation_output
from ..generation.request import RequestOutput
from ..handlers.custom_formatters import CustomFormatters
from ..handlers.inputs import Input
from .bodies import read_body, request_properties
from .engine_model import EngineModel
from .generation import output_error, respond, submit_all, timing_headers, updates
from .metrics import observe_generation

log = logging.getLogger("lmiserve.formatters")

JSONLINES = "application/jsonlines"


class FormatterFailed(Exception):
    """A custom formatter raised or returned something that cannot be sent."""


def error_payload(message: str, code: int = 424) -> bytes:
    return orjson.dumps({"error": message, "code": code})


def _error_response(message: str, code: int = 424) -> Response:
    return Response(error_payload(message, code), status_code=code, media_type="application/json")


def _lmi_error(err: LmiServeError) -> Response:
    code = 424 if isinstance(err, ValidationFailed) else (err.status if err.status >= 400 else 500)
    return _error_response(err.detail, code)


def _as_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict | list):
        return orjson.dumps(value)
    raise TypeError(f"returned {type(value).__name__}; return str or bytes")


class OutputFormatting:
    """Calls the output formatter for one request's updates."""

    def __init__(self, fn: Callable[..., Any], request: TextInput):
        self.fn = fn
        self.request = request
        self.name = getattr(fn, "__name__", "output_formatter")

    def __call__(self, out: RequestOutput) -> bytes:
        try:
            return _as_bytes(self.fn(generation_output(out, self.request)))
        except Exception as exc:  # noqa: BLE001 - the user's formatter; its request ends, the server goes on
            log.exception("output formatter %s failed on request %s", self.name, out.request_id)
            raise FormatterFailed(f"output formatter {self.name} failed: {type(exc).__name__}: {exc}") from None


def _parse(
    model: EngineModel,
    body: bytes,
    properties: dict[str, str],
    custom: CustomFormatters,
    defaults: lmi_rolling.Defaults,
) -> lmi_rolling.ParsedRequest:
    if custom.input is None:
        return lmi_rolling.parse_request(body, defaults)
    try:
        result = custom.input(Input(properties, [("data", body)]))
    except LmiServeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's input formatter refused the body
        name = getattr(custom.input, "__name__", "input_formatter")
        raise BadRequest(f"input formatter {name} failed: {type(exc).__name__}: {exc}") from None
    found = custom_input.normalize(result)
    return custom_input.to_request(found, defaults, lambda messages: model.chat_prompt(messages, None))


async def invoke_custom(
    model: EngineModel, request: Request, custom: CustomFormatters, defaults: lmi_rolling.Defaults
) -> Response:
    """Answer ``request`` through the model's custom formatters."""
    body = await read_body(request)
    try:
        req = _parse(model, body, request_properties(request), custom, defaults)
    except ValidationFailed as err:
        return _error_response(err.detail)
    if custom.output is None:
        return await respond(model, [req.generation], lmi_rolling.LmiResponder(req), request)
    text_input = TextInput(
        parameters=req.parameters.model_dump(exclude_defaults=True), stream=req.stream, input_text=req.generation.prompt
    )
    fmt = OutputFormatting(custom.output, text_input)
    media_type = custom.output_content_type or (JSONLINES if req.stream else lmi_rolling.JSON)
    try:
        gens = submit_all(model, [req.generation])
    except LmiServeError as err:
        return _lmi_error(err)
    text_input.request_id = gens[0].request_id
    stream = updates(model, gens, observe_generation(request, model.name))
    if req.stream:
        return await _streaming(stream, fmt, media_type)
    return await _whole(stream, fmt, media_type)


async def _whole(stream: AsyncIterator[tuple[int, RequestOutput]], fmt: OutputFormatting, media_type: str) -> Response:
    parts: list[bytes] = []
    outs: list[RequestOutput] = []
    try:
        async for _, out in stream:
            outs = [out]
            if out.error is not None:
                return _lmi_error(output_error(out))
            parts.append(fmt(out))
    except FormatterFailed as err:
        return _error_response(str(err))
    except LmiServeError as err:
        return _lmi_error(err)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return Response(b"".join(parts), media_type=media_type, headers=timing_headers(outs))


async def _streaming(
    stream: AsyncIterator[tuple[int, RequestOutput]], fmt: OutputFormatting, media_type: str
) -> Response:
    """Hold the headers back until the formatter has sent something, so an early failure is a 424."""
    head = b""
    try:
        async for _, out in stream:
            if out.error is not None:
                await stream.aclose()  # type: ignore[attr-defined]
                return _lmi_error(output_error(out))
            head = fmt(out)
            if head or out.finished:
                break
    except FormatterFailed as err:
        await stream.aclose()  # type: ignore[attr-defined]
        return _error_response(str(err))
    except LmiServeError as err:
        await stream.aclose()  # type: ignore[attr-defined]
        return _lmi_error(err)
    return StreamingResponse(_rest(head, stream, fmt), media_type=media_type)


async def _rest(
    head: bytes, stream: AsyncIterator[tuple[int, RequestOutput]], fmt: OutputFormatting
) -> AsyncIterator[bytes]:
    try:
        if head:
            yield head
        async for _, out in stream:
            if out.error is not None:
                yield error_payload(out.error) + b"\n"
                return
            data = fmt(out)
            if data:
                yield data
    except FormatterFailed as err:
        yield error_payload(str(err)) + b"\n"
    except LmiServeError as err:
        yield error_payload(err.detail) + b"\n"
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
