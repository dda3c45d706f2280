"""Open Inference Protocol (V2) inference on a model served by a user's handler.

The handler receives the V2 request body as it came (the way DJL's Python engine receives
any body) and answers with V2 output tensors: a JSON object with ``outputs`` (a whole
``$inference_response``), or just the list of output tensors. The answer is completed with
``model_name``, ``model_version`` and the ``id`` the protocol requires (the request's, else
a new one).
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import BadRequest, HandlerFailure
from . import json_wire
from .kserve import (
    BYTES,
    MODEL_VERSION,
    InferRequest,
    InferResponse,
    OutputTensor,
    flatten,
    make_tensor,
    new_request_id,
)

TENSOR_FIELDS = ("name", "datatype", "shape")


def request_id(body: bytes) -> str:
    """The ``id`` of a V2 request body, or "" (the body was validated already)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    value = data.get("id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


def handler_response(model_name: str, req_id: str, answer: bytes) -> bytes:
    """The handler's answer as a V2 ``$inference_response``; HandlerFailure when it holds no tensors."""
    try:
        data: Any = orjson.loads(answer)
    except orjson.JSONDecodeError:
        raise HandlerFailure("the handler's answer is not JSON; V2 inference needs output tensors") from None
    outputs = data if isinstance(data, list) else data.get("outputs") if isinstance(data, dict) else None
    if not isinstance(outputs, list) or not all(
        isinstance(t, dict) and all(k in t for k in TENSOR_FIELDS) and ("data" in t or "parameters" in t)
        for t in outputs
    ):
        raise HandlerFailure(
            "the handler's answer is not V2 output tensors: a JSON object with 'outputs', each with "
            "name, datatype, shape and data"
        )
    body: dict[str, Any] = {
        "model_name": model_name,
        "model_version": MODEL_VERSION,
        "id": req_id
        or (data.get("id") if isinstance(data, dict) and isinstance(data.get("id"), str) else "")
        or new_request_id(),
    }
    if isinstance(data, dict) and isinstance(data.get("parameters"), dict):
        body["parameters"] = data["parameters"]
    body["outputs"] = outputs
    return json_wire.dumps(body)


def request_body(req: InferRequest) -> bytes:
    """A V2 request that came over gRPC, as the REST JSON body a handler reads (BYTES elements
    as text, as REST carries them)."""

    def tensor(t: Any) -> dict[str, Any]:
        data = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in t.data]
        item: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": t.shape, "data": data}
        if t.parameters:
            item["parameters"] = t.parameters
        return item

    body: dict[str, Any] = {"inputs": [tensor(t) for t in req.inputs]}
    if req.id:
        body["id"] = req.id
    if req.parameters:
        body["parameters"] = req.parameters
    if req.outputs:
        body["outputs"] = [
            {"name": o.name, **({"parameters": o.parameters} if o.parameters else {})} for o in req.outputs
        ]
    return json_wire.dumps(body)


def response_tensors(model_name: str, req_id: str, answer: bytes) -> InferResponse:
    """The handler's answer as a checked V2 response (datatypes known, one element per position)."""
    data = orjson.loads(handler_response(model_name, req_id, answer))
    outputs = []
    for t in data["outputs"]:
        try:
            checked = make_tensor(t["name"], t["datatype"], t["shape"], flatten(t.get("data", [])))
        except BadRequest as exc:
            raise HandlerFailure(f"the handler's output tensors are not valid V2 tensors: {exc}") from None
        values = checked.data
        if checked.datatype == BYTES:
            values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values]
        outputs.append(OutputTensor(checked.name, checked.datatype, checked.shape, values))
    return InferResponse(data["model_name"], data["model_version"], data["id"], outputs)
