"""Amazon Bedrock's Meta Llama schema on ``/invocations`` over an engine model."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.responses import Response

from ...errors import ValidationFailed
from ...formatters import bedrock
from ...formatters.shapes import UNDECODABLE
from ...serving import EngineModel
from ..http_reply import respond_over_http


def is_bedrock_body(data: object) -> bool:
    """With ``option.bedrock_compat``, every body except LMI's ``inputs``, chat ``messages`` and
    KServe tensors is a Bedrock request (so a malformed one gets Bedrock's error)."""
    return not (isinstance(data, dict) and ("inputs" in data or "messages" in data))


async def invoke_bedrock(model: EngineModel, request: Request, body: bytes, data: Any = UNDECODABLE) -> Response:
    request.state.protocol = "bedrock"
    try:
        req = bedrock.parse_request(body, stream=bedrock.wants_stream(request.headers), data=data)
    except ValidationFailed as err:
        status, data, headers = bedrock.error_body(err)
        return Response(data, status_code=status, media_type=bedrock.JSON, headers=headers)
    return await respond_over_http(model, [req.generation], bedrock.BedrockResponder(req), request)
