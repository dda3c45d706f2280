"""LMI's "Rolling Batch / Continuous Batch" schema.

Request ``{"inputs": str, "parameters": {...}, "stream": bool}``. Non-streaming answers
``{"generated_text": ..., "details": {...}}`` (a one-element list with ``tgi_compat``);
streaming answers one ``{"token": {...}}`` line per token as jsonlines (default) or SSE, the
last line also carrying ``generated_text`` and, when asked for, ``details``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator, model_validator

from ..errors import BadRequest, InvalidParameter, LmiServeError, ValidationFailed
from ..generation.request import GenerationRequest, RequestOutput, SequenceOutput
from ..wire import SamplingParams
from . import tokens
from .responder import Responder
from .shapes import UNDECODABLE, lmi_object
from .validation import describe

JSON = "application/json"
JSONLINES = "application/jsonlines"
SSE = "text/event-stream"
MAX_SEED = 2**63 - 1


class RollingParameters(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    do_sample: bool = False
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    temperature: float = Field(1.0, ge=0)
    repetition_penalty: float = Field(1.0, gt=0)
    top_k: int = Field(0, ge=-1)
    top_p: float = Field(1.0, gt=0, le=1)
    min_p: float = Field(0.0, ge=0, le=1)
    typical_p: float = Field(1.0, gt=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    max_new_tokens: int = Field(30, ge=1)
    details: bool = False
    return_full_text: bool = False
    stop_sequences: tuple[StrictStr, ...] = ()
    decoder_input_details: bool = False
    truncate: int | None = Field(None, ge=1)
    ignore_eos_token: bool = False
    n: int = Field(1, ge=1)
    best_of: int | None = Field(None, ge=1)
    num_beams: int = Field(1, ge=1, le=16)
    length_penalty: float = 1.0
    early_stopping: bool = False
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    top_n_tokens: int = Field(0, ge=0, le=20)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    output_formatter: Literal["json", "jsonlines", "sse"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_and_aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None}
            if "ignore_eos" in data and "ignore_eos_token" not in data:
                data["ignore_eos_token"] = data.pop("ignore_eos")
            if isinstance(data.get("stop_sequences"), str):
                data["stop_sequences"] = [data["stop_sequences"]]
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RollingParameters:
        if self.num_beams > 1 and self.n > self.num_beams:
            raise ValueError(f"n ({self.n}) must not exceed num_beams ({self.num_beams})")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be at least n ({self.n})")
        return self


class RollingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    inputs: StrictStr
    parameters: RollingParameters = RollingParameters()
    stream: bool | None = None
    adapters: StrictStr | list[StrictStr] | None = None
    """DJL's adapter for the request: a name, or a list of one name per input ("" for the base model)."""

    @property
    def adapter(self) -> str | None:
        names = self.adapters if isinstance(self.adapters, list) else [self.adapters]
        if len(names) != 1:  # DJL's words
            raise InvalidParameter("Number of adapters is not equal to the number of inputs")
        return names[0] or None

    @field_validator("parameters", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return {} if v is None else v


@dataclass
class Defaults:
    """What the model's configuration says about response formats."""

    output_formatter: str = "json"
    tgi_compat: bool = False
    enable_streaming: bool = False


@dataclass
class ParsedRequest:
    generation: GenerationRequest
    parameters: RollingParameters
    stream: bool
    output_format: str  # json | jsonlines | sse
    tgi_compat: bool

    @property
    def content_type(self) -> str:
        return {"json": JSON, "jsonlines": JSONLINES, "sse": SSE}[self.output_format]


def _sampling(p: RollingParameters) -> SamplingParams:
    if p.num_beams > 1:  # every beam comes back: the best answers, the others are best_of_sequences
        return SamplingParams(
            max_new_tokens=p.max_new_tokens,
            n=p.num_beams,
            best_of=p.num_beams,
            num_beams=p.num_beams,
            length_penalty=p.length_penalty,
            early_stopping=p.early_stopping,
            ignore_eos=p.ignore_eos_token,
            logprobs=p.top_n_tokens,
        )
    greedy = p.temperature == 0  # as vLLM-backed LMI: temperature 0 is greedy decoding
    return SamplingParams(
        max_new_tokens=p.max_new_tokens,
        do_sample=p.do_sample and not greedy,
        temperature=p.temperature if not greedy else 1.0,
        top_k=max(p.top_k, 0),
        top_p=p.top_p,
        min_p=p.min_p,
        typical_p=p.typical_p,
        repetition_penalty=p.repetition_penalty,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        seed=p.seed,
        n=p.n,
        best_of=max(p.best_of or 1, p.n),
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos_token,
        logprobs=max(p.logprobs or 0, p.top_n_tokens),
        prompt_logprobs=(
            max(p.prompt_logprobs or 0, p.top_n_tokens)
            if p.decoder_input_details or p.prompt_logprobs is not None
            else None
        ),
    )


VALUE_ERRORS = frozenset(
    {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "value_error", "literal_error"}
)
"""Pydantic error types that mean a value out of range rather than a body of the wrong shape."""


def parse_request(body: bytes, defaults: Defaults, data: Any = UNDECODABLE) -> ParsedRequest:
    """Parse and validate: :class:`BadRequest` for a body that does not fit the schema (not
    JSON, no ``inputs``, a wrong type), :class:`InvalidParameter` for a value out of range.
    ``data`` is the body already decoded (:func:`.shapes.decode`), where the caller has it."""
    data = lmi_object(body, data)
    if defaults.tgi_compat and "details" not in (data.get("parameters") or {}):
        # DJL turns details on under tgi_compat, as TGI's clients expect them
        data = {**data, "parameters": {**(data.get("parameters") or {}), "details": True}}
    try:
        request = RollingRequest.model_validate(data)
    except ValidationError as err:
        if all(e.get("type") in VALUE_ERRORS for e in err.errors()):
            raise InvalidParameter(describe(err)) from None
        raise BadRequest(describe(err)) from None
    p = request.parameters
    stream, fmt = _stream_and_format(request.stream, p.output_formatter, defaults)
    if stream and (p.n > 1 or (p.best_of or 1) > 1 or p.num_beams > 1):
        raise InvalidParameter("n, best_of and num_beams greater than 1 work only without streaming")
    generation = GenerationRequest(
        prompt=request.inputs,
        params=_sampling(p),
        stop=list(p.stop_sequences),
        include_stop_str_in_output=p.include_stop_str_in_output,
        skip_special_tokens=p.skip_special_tokens,
        spaces_between_special_tokens=p.spaces_between_special_tokens,
        truncate=p.truncate,
        adapter=request.adapter,
    )
    return ParsedRequest(generation, p, stream, fmt, defaults.tgi_compat)


def _stream_and_format(stream: bool | None, formatter: str | None, defaults: Defaults) -> tuple[bool, str]:
    """Whether to stream, and the format: json when not streaming, else jsonlines or sse."""
    fmt = formatter or defaults.output_formatter
    if fmt not in ("json", "jsonlines", "sse"):
        fmt = "json"
    if stream is None:
        stream = defaults.enable_streaming or fmt in ("jsonlines", "sse")
    if stream and fmt == "json":
        fmt = "sse" if defaults.tgi_compat else "jsonlines"
    return stream, fmt if stream else "json"


def refusal(body: bytes, defaults: Defaults, err: LmiServeError) -> tuple[int, bytes, str]:
    """``(status, body, media type)`` for a request refused before generation began.

    A body that does not fit the schema gets the document's payload-validation answer,
    ``{"error", "code": 424}`` with status 424. A well-formed request with a bad parameter
    value gets the document's error response with status 400: the ``generated_text: ""``
    object, or, for a streaming request, the one ``{"token": {"id": -1, ...}}`` line.
    """
    if not isinstance(err, InvalidParameter):
        return 424, validation_error_body(err.detail), JSON
    data = orjson.loads(body)
    params = data.get("parameters") or {}
    raw_stream = data.get("stream")
    formatter = params.get("output_formatter")
    stream, fmt = _stream_and_format(
        raw_stream if isinstance(raw_stream, bool) else None,
        formatter if isinstance(formatter, str) else None,
        defaults,
    )
    req = ParsedRequest(GenerationRequest("", SamplingParams()), RollingParameters(), stream, fmt, defaults.tgi_compat)
    if stream:
        return 400, stream_error_chunk(req, err.detail), req.content_type
    return 400, generation_error_body(req), JSON


# --- responses ---------------------------------------------------------------------------


def _sequence_details(seq: SequenceOutput, req: ParsedRequest) -> dict[str, Any]:
    tgi = req.tgi_compat
    details: dict[str, Any] = {
        "finish_reason": seq.finish_reason,
        "generated_tokens": len(seq.tokens),
        "tokens": [tokens.token(t, tgi) for t in seq.tokens],
    }
    if req.parameters.top_n_tokens:
        details["top_tokens"] = [tokens.top(t, tgi) for t in seq.tokens]
    return details


def final_body(out: RequestOutput, req: ParsedRequest) -> bytes:
    """The whole non-streaming answer."""
    p = req.parameters
    tgi = req.tgi_compat
    ranked = out.ranked()
    best = ranked[0]
    body: dict[str, Any] = {"generated_text": _full_text(out, best, p)}
    if p.details or p.decoder_input_details:
        details: dict[str, Any] = {
            "finish_reason": best.finish_reason,
            "generated_tokens": len(best.tokens),
            "inputs": out.prompt,
            "tokens": [tokens.token(t, tgi) for t in best.tokens],
        }
        if p.top_n_tokens:
            details["top_tokens"] = [tokens.top(t, tgi) for t in best.tokens]
        if p.decoder_input_details and out.prompt_tokens is not None:
            details["prefill"] = [tokens.token(t, tgi) for t in out.prompt_tokens]
        count = p.num_beams if p.num_beams > 1 else p.n if p.n > 1 else (p.best_of or 1)
        if count > 1:
            details["best_of_sequences"] = [
                {**_sequence_details(s, req), "generated_text": _full_text(out, s, p)} for s in ranked[1:count]
            ]
        body["details"] = details
    return orjson.dumps([body] if tgi else body)


def _full_text(out: RequestOutput, seq: SequenceOutput, p: RollingParameters) -> str:
    return out.prompt + seq.text if p.return_full_text else seq.text


def _frame(obj: Any, req: ParsedRequest) -> bytes:
    data = orjson.dumps(obj)
    return b"data:" + data + b"\n\n" if req.output_format == "sse" else data + b"\n"


def stream_chunks(out: RequestOutput, req: ParsedRequest, first: bool) -> bytes:
    """Lines for the tokens added by the latest update (the last one carries the final fields)."""
    seq = out.sequences[0]
    p = req.parameters
    tgi = req.tgi_compat
    lines = []
    new = seq.new_tokens
    prefix = out.prompt if (first and p.return_full_text) else ""
    for i, t in enumerate(new):
        line: dict[str, Any] = {"token": tokens.token(t, tgi)}
        if prefix and i == 0:
            line["token"]["text"] = prefix + t.text
        if p.top_n_tokens:
            line["top_tokens"] = tokens.top(t, tgi)
        last = i == len(new) - 1 and seq.finished
        if last:
            line["generated_text"] = _full_text(out, seq, p)
            if p.details or p.decoder_input_details:
                details: dict[str, Any] = {
                    "finish_reason": seq.finish_reason,
                    "generated_tokens": len(seq.tokens),
                    "inputs": out.prompt,
                }
                if p.decoder_input_details and out.prompt_tokens is not None:
                    details["prefill"] = [tokens.token(t, tgi) for t in out.prompt_tokens]
                line["details"] = details
            elif tgi:
                line["details"] = None
        elif tgi:
            line["generated_text"] = None
            line["details"] = None
        lines.append(_frame(line, req))
    return b"".join(lines)


# --- errors ------------------------------------------------------------------------------


class LmiResponder(Responder):
    """The rolling-batch schema as a server Responder."""

    def __init__(self, req: ParsedRequest):
        self.req = req
        self.stream = req.stream
        self.media_type = req.content_type
        self._started = False

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        data = stream_chunks(out, self.req, first=not self._started)
        self._started = self._started or bool(out.sequences[0].new_tokens)
        return data

    def body(self, outs: list[RequestOutput]) -> bytes:
        return final_body(outs[0], self.req)

    def error_chunk(self, message: str) -> bytes:
        return stream_error_chunk(self.req, message)

    @property
    def error_media_type(self) -> str:
        return self.req.content_type

    def error_body(self, err: LmiServeError) -> tuple[int, bytes]:
        """A request refused or failed before its first byte: the document's error response
        (the stream's error line when streaming); a refused value is a 400."""
        status = 400 if isinstance(err, ValidationFailed) else err.status if err.status >= 400 else 500
        if self.stream:
            return status, stream_error_chunk(self.req, err.detail)
        return status, generation_error_body(self.req)


def validation_error_body(message: str) -> bytes:
    return orjson.dumps({"error": message, "code": 424})


def generation_error_body(req: ParsedRequest | None) -> bytes:
    body = {
        "generated_text": "",
        "details": {"finish_reason": "error", "generated_tokens": None, "inputs": None, "tokens": None},
    }
    return orjson.dumps([body] if req is not None and req.tgi_compat else body)


def stream_error_chunk(req: ParsedRequest, message: str) -> bytes:
    if req.tgi_compat:
        return _frame({"error": message, "error_type": "generation"}, req)
    return _frame(
        {
            "token": tokens.lmi_fields(-1, "", -1, True),
            "generated_text": "",
            "details": {"finish_reason": "error", "generated_tokens": None, "inputs": None},
        },
        req,
    )
