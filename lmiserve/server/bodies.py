"""Reading requests: bodies, properties, SageMaker custom attributes."""

from __future__ import annotations

import orjson
from fastapi import Request

from ..errors import BadRequest

CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
ADAPTER_HEADER = "x-amzn-sagemaker-adapter-identifier"


def parse_custom_attributes(value: str) -> dict[str, str]:
    """``k=v;k2=v2`` (SageMaker's X-Amzn-SageMaker-Custom-Attributes) as a dict."""
    result: dict[str, str] = {}
    for part in value.split(";"):
        if "=" in part:
            key, _, val = part.partition("=")
            if key.strip():
                result[key.strip()] = val.strip()
        elif part.strip():
            result[part.strip()] = ""
    return result


def request_properties(request: Request) -> dict[str, str]:
    """Headers, query parameters and custom attributes, as a handler's Input properties."""
    props: dict[str, str] = {}
    for raw_name, raw_value in request.scope.get("headers") or []:
        name = raw_name.decode("latin-1")
        value = raw_value.decode("latin-1")
        props[name] = value
        if name.lower() == CUSTOM_ATTRIBUTES:
            props.update(parse_custom_attributes(value))
    for key, value in request.query_params.items():
        props.setdefault(key, value)
    return props


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def read_body(request: Request) -> bytes:
    body = await request.body()
    if body and _is_json(request.headers.get("content-type", "")):
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
    return body


def requested_adapter(request: Request) -> str | None:
    """The LoRA adapter named outside the body, as DJL reads it: SageMaker's
    X-Amzn-SageMaker-Adapter-Identifier header, else the ``adapter`` query parameter."""
    return request.headers.get(ADAPTER_HEADER) or request.query_params.get("adapter") or None
