"""KServe V2's generate extension: ``{"text_input", "parameters"}`` in,
``{"model_name", "model_version", "text_output"}`` out (``generate_stream``: one SSE event per
piece of new text). The parameters are the inference request's (:class:`.kserve.GenerateParameters`).
"""

from __future__ import annotations

from typing import Any

from ..errors import BadRequest
from ..generation.request import RequestOutput
from . import errors, json_wire
from .kserve import (
    MODEL_VERSION,
    PARAMETER_INPUTS,
    SSE,
    TEXT_INPUT,
    TEXT_OUTPUT,
    GenerateParameters,
    object_field,
    parameters,
)


def parse_generate(data: Any) -> tuple[str, GenerateParameters]:
    """``{"text_input": "...", "parameters": {...}}``; parameters may also stand at the top level."""
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object with 'text_input'")
    prompt = data.get(TEXT_INPUT)
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest(f"{TEXT_INPUT!r} must be a non-empty string")
    merged = dict(object_field(data.get("parameters"), "'parameters'"))
    for key, value in data.items():
        if key in (TEXT_INPUT, "parameters", "id"):
            continue
        if key not in PARAMETER_INPUTS:
            raise BadRequest(f"unknown field {key!r}: the body takes {TEXT_INPUT!r} and generation parameters")
        merged[key] = value
    return prompt, parameters(merged)


class GenerateResponder(errors.ErrorsIn):
    """The generate extension as a server Responder: one object, or SSE events of new text."""

    error_shape = staticmethod(errors.kserve)

    def __init__(self, model_name: str, params: GenerateParameters, stream: bool):
        self.model_name = model_name
        self.params = params
        self.stream = stream
        self.media_type = SSE if stream else "application/json"
        self._prefix_sent = not params.return_full_text

    def _event(self, text: str) -> bytes:
        body = {"model_name": self.model_name, "model_version": MODEL_VERSION, TEXT_OUTPUT: text}
        return b"data: " + json_wire.dumps(body) + b"\n\n"

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        text = "".join(t.text for t in out.sequences[0].new_tokens)
        if not self._prefix_sent:
            text, self._prefix_sent = out.prompt + text, True
        return self._event(text) if text else b""

    def end(self, outs: list[RequestOutput]) -> bytes:
        if not self._prefix_sent and outs:
            self._prefix_sent = True
            return self._event(outs[0].prompt)
        return b""

    def body(self, outs: list[RequestOutput]) -> bytes:
        out = outs[0]
        text = (out.prompt if self.params.return_full_text else "") + out.sequences[0].text
        return json_wire.dumps({"model_name": self.model_name, "model_version": MODEL_VERSION, TEXT_OUTPUT: text})
