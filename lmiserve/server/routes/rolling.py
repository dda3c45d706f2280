"""LMI's rolling-batch schema on ``/invocations`` and ``/predictions``, over an engine model,
with the model's own input and output formatters where it has them."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.responses import Response

from ...errors import BadRequest, ValidationFailed
from ...formatters import lmi_rolling, lmi_rolling_output
from ...formatters.request_io import TextInput
from ...formatters.shapes import UNDECODABLE
from ...handlers.custom_formatters import CustomResponder, error_payload, parse_custom
from ...serving import EngineModel, Responder
from ..bodies import read_body, request_properties, requested_adapter
from ..http_reply import respond_over_http


def defaults(model: EngineModel) -> lmi_rolling.Defaults:
    cfg = model.settings.model
    return lmi_rolling.Defaults(
        output_formatter=cfg.output_formatter, tgi_compat=cfg.tgi_compat, enable_streaming=cfg.enable_streaming
    )


async def invoke_rolling(
    model: EngineModel, request: Request, body: bytes | None = None, data: Any = UNDECODABLE
) -> Response:
    """``body`` (and ``data``, the body decoded) where the caller has read it already."""
    custom = model.custom_formatters
    if custom:  # a model's own formatters: LMI's 424 payload for a request they cannot run
        body = await read_body(request) if body is None else body
        try:
            req = _parse_custom(model, body, request)
        except ValidationFailed as err:
            return Response(error_payload(err.detail), status_code=424, media_type=lmi_rolling.JSON)
    else:
        try:
            if body is None:
                body = b""
                body = await read_body(request)
            req = lmi_rolling.parse_request(body, defaults(model), data)
        except (BadRequest, ValidationFailed) as err:
            status, data, media_type = lmi_rolling_output.refusal(body, defaults(model), err)
            return Response(data, status_code=status, media_type=media_type)
    req.generation.adapter = requested_adapter(request) or req.generation.adapter  # the header wins, as in DJL
    responder: Responder = lmi_rolling_output.LmiResponder(req)
    if custom and custom.output is not None:
        text_input = TextInput(
            parameters=req.parameters.model_dump(exclude_defaults=True),
            stream=req.stream,
            input_text=req.generation.prompt,
        )
        responder = CustomResponder(custom.output, text_input, custom.output_content_type)
    return await respond_over_http(model, [req.generation], responder, request)


def _parse_custom(model: EngineModel, body: bytes, request: Request) -> lmi_rolling.ParsedRequest:
    custom = model.custom_formatters
    if custom.input is None:
        return lmi_rolling.parse_request(body, defaults(model))
    properties = request_properties(request)
    return parse_custom(custom.input, body, properties, defaults(model), lambda m: model.chat_prompt(m, None))
