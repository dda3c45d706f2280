"""KServe V2 inference for text generation: a checked request's plan, and its answer.

:func:`plan` checks an inference request before anything is generated (see
:mod:`.kserve` for where its parameters come from); :class:`InferResponder` answers it, through
:func:`lmiserve.serving.respond`, with a BYTES ``text_output`` tensor of the generated texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import BadRequest, LmiServeError
from ..generation.request import GenerationRequest, RequestOutput
from . import errors, json_wire
from .kserve import (
    HEADER_LENGTH,
    MODEL_VERSION,
    PARAMETER_INPUTS,
    TEXT_INPUT,
    TEXT_OUTPUT,
    GenerateParameters,
    new_request_id,
    parameters,
)
from .kserve_tensors import BYTES, InferRequest, InferResponse, OutputTensor, RequestedOutput, Tensor, encode_raw

LIST_PARAMETERS = {"stop", "stop_words", "stop_sequences", "stop_token_ids", "bad_words"}
"""Parameters given as an input tensor whose every element is one item of the list."""


def _text(value: Any, what: str) -> str:
    try:
        return value.decode() if isinstance(value, bytes) else value
    except UnicodeDecodeError:
        raise BadRequest(f"{what} is not valid UTF-8") from None


def _parameter_input(t: Tensor) -> dict[str, Any]:
    values = [_text(v, f"input {t.name!r}") for v in t.data]
    if t.name == "sampling_parameters":
        try:
            obj = orjson.loads(values[0]) if len(values) == 1 else None
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            raise BadRequest("input 'sampling_parameters' must hold one JSON object")
        return obj
    if t.name in LIST_PARAMETERS:
        return {t.name: values}
    if len(values) != 1:
        raise BadRequest(f"input {t.name!r} must hold one value (it holds {len(values)})")
    return {t.name: values[0]}


@dataclass
class InferPlan:
    """A checked inference request: the prompts, their parameters and the outputs to send."""

    request: InferRequest
    prompts: list[str]
    shape: list[int]
    params: GenerateParameters
    outputs: list[tuple[str, bool]]
    """Each requested output's name and whether it goes in a REST body's binary section."""

    def generation_requests(self) -> list[GenerationRequest]:
        return [self.params.request(p) for p in self.prompts]

    def text(self, out: RequestOutput) -> str:
        text = out.sequences[0].text
        return out.prompt + text if self.params.return_full_text else text

    def response(self, model_name: str, texts: list[str]) -> InferResponse:
        outputs = [OutputTensor(name, BYTES, list(self.shape), list(texts), binary) for name, binary in self.outputs]
        # the Open Inference Protocol's response always has an id: the request's, else a new one
        return InferResponse(model_name, MODEL_VERSION, self.request.id or new_request_id(), outputs)


def plan(req: InferRequest) -> InferPlan:
    """Check a text-generation request before anything is generated."""
    by_name: dict[str, Tensor] = {}
    for t in req.inputs:
        if t.name in by_name:
            raise BadRequest(f"input {t.name!r} appears more than once")
        by_name[t.name] = t
    text = by_name.pop(TEXT_INPUT, None)
    if text is None:
        raise BadRequest(f"the request has no {TEXT_INPUT!r} input (a BYTES tensor of prompts)")
    if text.datatype != BYTES:
        raise BadRequest(f"input {TEXT_INPUT!r} must be BYTES (got {text.datatype})")
    if not text.data:
        raise BadRequest(f"input {TEXT_INPUT!r} holds no prompts")
    merged = {**req.parameters, **text.parameters}
    for name, t in by_name.items():
        if name not in PARAMETER_INPUTS and name != "sampling_parameters":
            raise BadRequest(f"unknown input {name!r}: this model takes {TEXT_INPUT!r} and generation parameters")
        merged.update(_parameter_input(t))
    params = parameters(merged)
    default_binary = req.parameters.get("binary_data_output") is True
    outputs = []
    for o in req.outputs or [RequestedOutput(TEXT_OUTPUT)]:
        if o.name != TEXT_OUTPUT:
            raise BadRequest(f"unknown output {o.name!r}: this model has one output, {TEXT_OUTPUT!r}")
        outputs.append((o.name, bool(o.parameters.get("binary_data", default_binary))))
    prompts = [_text(p, f"input {TEXT_INPUT!r}") for p in text.data]
    return InferPlan(req, prompts, text.shape, params, outputs)


def rest_body(resp: InferResponse) -> tuple[bytes, int | None]:
    """A REST answer: JSON, or with binary outputs the JSON header, the tensors, and the
    header's length (for ``Inference-Header-Content-Length``)."""
    outputs, binary = [], []
    for o in resp.outputs:
        tensor: dict[str, Any] = {"name": o.name, "datatype": o.datatype, "shape": o.shape}
        if o.binary:
            raw = encode_raw(o.datatype, o.data)
            tensor["parameters"] = {"binary_data_size": len(raw)}
            binary.append(raw)
        else:
            tensor["data"] = o.data
        outputs.append(tensor)
    body: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version}
    if resp.id:
        body["id"] = resp.id
    body["outputs"] = outputs
    header = json_wire.dumps(body)
    if not binary:
        return header, None
    return header + b"".join(binary), len(header)


class InferResponder(errors.ErrorsIn):
    """A V2 inference request's answer, never streamed: the REST body (JSON, or with binary
    outputs the JSON header and the tensors), and :attr:`response` or :attr:`error` for a
    transport that sends its own messages (gRPC)."""

    error_shape = staticmethod(errors.kserve)

    def __init__(self, plan: InferPlan, model_name: str):
        self.plan = plan
        self.model_name = model_name
        self.response: InferResponse | None = None
        self.error: LmiServeError | None = None
        self._header_length: int | None = None

    def body(self, outs: list[RequestOutput]) -> bytes:
        self.response = self.plan.response(self.model_name, [self.plan.text(o) for o in outs])
        body, self._header_length = rest_body(self.response)
        if self._header_length is not None:
            self.body_media_type = "application/octet-stream"
        return body

    def headers(self, outs: list[RequestOutput]) -> dict[str, str]:
        return {} if self._header_length is None else {HEADER_LENGTH: str(self._header_length)}

    def error_body(self, err: LmiServeError) -> tuple[int, bytes]:
        self.error = err
        return super().error_body(err)
