"""Amazon Bedrock's Meta Llama schema (``option.bedrock_compat=true``).

Request ``{"prompt": str, "temperature": 0..1, "top_p": 0..1, "max_gen_len": int >= 1}``
(defaults 0.5, 0.9 and 512; temperature 0 is greedy; any other key is refused, as Bedrock
does). The non-streaming answer is ``{"generation", "prompt_token_count",
"generation_token_count", "stop_reason"}`` with ``stop_reason`` ``"stop"`` (end of sequence)
or ``"length"`` (``max_gen_len`` or the context reached). Streaming (chosen by the
``X-Amzn-SageMaker-Forwarded-Api: InvokeEndpointWithResponseStream`` header) sends one JSON
line per update: the new text in ``generation``, ``prompt_token_count`` on the first line only
(null afterwards), the running ``generation_token_count``, and ``stop_reason`` null until the
last line. Errors are ``{"message": ...}``; validation errors answer 400 (ValidationException).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import LmiServeError, ValidationFailed
from ..generation.request import GenerationRequest, RequestOutput
from ..wire import SamplingParams
from . import json_wire
from .errors import bedrock as bedrock_error
from .errors import bedrock_type
from .responder import Responder
from .shapes import UNDECODABLE

JSON = "application/json"
JSONLINES = "application/jsonlines"
STREAM_HEADER = "x-amzn-sagemaker-forwarded-api"
STREAM_API = "InvokeEndpointWithResponseStream"
ERROR_TYPE_HEADER = "x-amzn-ErrorType"

DEFAULT_TEMPERATURE = 0.5
DEFAULT_TOP_P = 0.9
DEFAULT_MAX_GEN_LEN = 512
KEYS = ("prompt", "temperature", "top_p", "max_gen_len")


def _malformed(reason: str) -> ValidationFailed:
    return ValidationFailed(f"Malformed input request: {reason}, please reformat your input and try again.")


def _number(data: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _malformed(f"#/{key}: expected type: Number, found: {type(value).__name__}")
    if not low <= value <= high:
        raise _malformed(f"#/{key}: {value} is not between {low:g} and {high:g}")
    return float(value)


def wants_stream(headers: Any) -> bool:
    """Whether the request came through SageMaker's InvokeEndpointWithResponseStream."""
    return str(headers.get(STREAM_HEADER, "")).strip().lower() == STREAM_API.lower()


@dataclass
class BedrockRequest:
    generation: GenerationRequest
    stream: bool


def parse_request(body: bytes, stream: bool = False, data: Any = UNDECODABLE) -> BedrockRequest:
    """Parse and validate a body (``data``: already decoded, where the caller has it);
    ValidationFailed (Bedrock's wording) for anything wrong."""
    if data is UNDECODABLE:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise _malformed("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise _malformed(f"#: expected type: JSONObject, found: {type(data).__name__}")
    extra = [k for k in data if k not in KEYS]
    if extra:
        raise _malformed(f"#: extraneous key [{extra[0]}] is not permitted")
    if "prompt" not in data:
        raise _malformed("#: required key [prompt] not found")
    prompt = data["prompt"]
    if not isinstance(prompt, str):
        raise _malformed(f"#/prompt: expected type: String, found: {type(prompt).__name__}")
    temperature = _number(data, "temperature", DEFAULT_TEMPERATURE, 0.0, 1.0)
    top_p = _number(data, "top_p", DEFAULT_TOP_P, 0.0, 1.0)
    max_gen_len = data.get("max_gen_len", DEFAULT_MAX_GEN_LEN)
    if isinstance(max_gen_len, bool) or not isinstance(max_gen_len, int):
        raise _malformed(f"#/max_gen_len: expected type: Integer, found: {type(max_gen_len).__name__}")
    if max_gen_len < 1:
        raise _malformed(f"#/max_gen_len: {max_gen_len} is not greater or equal to 1")
    greedy = temperature == 0 or top_p == 0
    params = SamplingParams(
        max_new_tokens=max_gen_len,
        do_sample=not greedy,
        temperature=1.0 if greedy else temperature,
        top_p=1.0 if greedy else top_p,
    )
    return BedrockRequest(GenerationRequest(prompt=prompt, params=params), stream)


def stop_reason(finish_reason: str | None) -> str | None:
    """Bedrock's Llama stop reasons: "length" when the length limit ended it, else "stop"."""
    if finish_reason is None:
        return None
    return "length" if finish_reason == "length" else "stop"


def final_body(out: RequestOutput) -> bytes:
    seq = out.sequences[0]
    return json_wire.dumps(
        {
            "generation": seq.text,
            "prompt_token_count": len(out.prompt_token_ids),
            "generation_token_count": len(seq.tokens),
            "stop_reason": stop_reason(seq.finish_reason),
        }
    )


def error_body(err: LmiServeError) -> tuple[int, bytes, dict[str, str]]:
    """Status, ``{"message"}`` body and the ``x-amzn-ErrorType`` header for an error."""
    status, body = bedrock_error(err)
    return status, json_wire.dumps(body), {ERROR_TYPE_HEADER: bedrock_type(err)[0]}


class BedrockResponder(Responder):
    """The Bedrock Llama schema as a server Responder."""

    def __init__(self, req: BedrockRequest):
        self.req = req
        self.stream = req.stream
        self.media_type = JSONLINES if req.stream else JSON
        self._sent_text = 0
        self._first = True

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        seq = out.sequences[0]
        if not seq.new_tokens and not seq.finished:
            return b""
        line = {
            "generation": seq.text[self._sent_text :],
            "prompt_token_count": len(out.prompt_token_ids) if self._first else None,
            "generation_token_count": len(seq.tokens),
            "stop_reason": stop_reason(seq.finish_reason),
        }
        self._sent_text = len(seq.text)
        self._first = False
        return json_wire.dumps(line) + b"\n"

    def body(self, outs: list[RequestOutput]) -> bytes:
        return final_body(outs[0])

    def error_chunk(self, message: str) -> bytes:
        """A failure after the first line: Bedrock's stream error event, as a last line."""
        return json_wire.dumps({"message": message, "type": "modelStreamErrorException"}) + b"\n"

    def error_body(self, err: LmiServeError) -> tuple[int, bytes]:
        status, body, _ = error_body(err)
        return status, body
