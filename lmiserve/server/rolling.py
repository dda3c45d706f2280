"""LMI's rolling-batch schema on ``/invocations`` and ``/predictions``, over an engine model."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from ..errors import BadRequest, ValidationFailed
from ..formatters import lmi_rolling
from .bodies import read_body
from .custom_rolling import invoke_custom
from .engine_model import EngineModel
from .generation import respond


def defaults(model: EngineModel) -> lmi_rolling.Defaults:
    cfg = model.settings.model
    return lmi_rolling.Defaults(
        output_formatter=cfg.output_formatter, tgi_compat=cfg.tgi_compat, enable_streaming=cfg.enable_streaming
    )


async def invoke_rolling(model: EngineModel, request: Request) -> Response:
    if model.custom_formatters:
        return await invoke_custom(model, request, model.custom_formatters, defaults(model))
    body = b""
    try:
        body = await read_body(request)
        req = lmi_rolling.parse_request(body, defaults(model))
    except (BadRequest, ValidationFailed) as err:
        status, data, media_type = lmi_rolling.refusal(body, defaults(model), err)
        return Response(data, status_code=status, media_type=media_type)
    return await respond(model, [req.generation], lmi_rolling.LmiResponder(req), request)
