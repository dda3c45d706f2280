"""LMI's "Rolling Batch / Continuous Batch" schema.

Request ``{"inputs": str, "parameters": {...}, "stream": bool}``, parsed and validated here
into a :class:`~lmiserve.generation.request.GenerationRequest`; the answers are in
:mod:`.lmi_rolling_output`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ..errors import BadRequest, InvalidParameter
from ..generation.request import GenerationRequest
from ..wire import SamplingParams
from .lmi_dynamic import LmiSampling
from .sampling_params import beam_search, sampled
from .shapes import UNDECODABLE, lmi_object
from .validation import describe

JSON = "application/json"
JSONLINES = "application/jsonlines"
SSE = "text/event-stream"


class RollingParameters(LmiSampling):
    temperature: float = Field(1.0, ge=0)
    top_k: int = Field(0, ge=-1)
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
    min_length: int = Field(0, ge=0)
    """TensorRT-LLM's: the fewest tokens generated before an end-of-sequence or stop token may end it."""
    bad_sequences: tuple[StrictStr, ...] = ()
    """TensorRT-LLM's: texts the output must not contain."""
    stop: bool | tuple[StrictStr, ...] = False
    """TensorRT-LLM's flag that stops a request in flight (a new request cannot carry ``true``);
    or, as DJL's vLLM path hands it to vLLM, more stop strings."""
    speculate: StrictBool = True
    """False: no speculative decoding for this request (where the model has it configured)."""

    @model_validator(mode="before")
    @classmethod
    def _nulls_and_aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None}
            if "ignore_eos" in data and "ignore_eos_token" not in data:
                data["ignore_eos_token"] = data.pop("ignore_eos")
            for key in ("stop_sequences", "bad_sequences", "stop"):
                if isinstance(data.get(key), str):
                    data[key] = [data[key]]
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RollingParameters:
        if self.num_beams > 1 and self.n > self.num_beams:
            raise ValueError(f"n ({self.n}) must not exceed num_beams ({self.num_beams})")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be at least n ({self.n})")
        if self.stop is True:
            raise ValueError(
                "stop: true stops a TensorRT-LLM request in flight; a new request with it would generate nothing"
            )
        if self.bad_sequences and self.num_beams > 1:
            raise ValueError("bad_sequences does not combine with beam search (num_beams > 1)")
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
        width, asked = p.num_beams, {"max_new_tokens": p.max_new_tokens, "logprobs": p.top_n_tokens}
        return beam_search(p, width, width, p.ignore_eos_token, **asked)
    asks_prompt = p.decoder_input_details or p.prompt_logprobs is not None
    return sampled(  # as vLLM-backed LMI: temperature 0 is greedy decoding
        p,
        p.do_sample,
        max_new_tokens=p.max_new_tokens,
        min_new_tokens=p.min_length,
        bad_words=list(p.bad_sequences),
        typical_p=p.typical_p,
        seed=p.seed,
        n=p.n,
        best_of=max(p.best_of or 1, p.n),
        ignore_eos=p.ignore_eos_token,
        logprobs=max(p.logprobs or 0, p.top_n_tokens),
        prompt_logprobs=max(p.prompt_logprobs or 0, p.top_n_tokens) if asks_prompt else None,
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
    stream, fmt = stream_and_format(request.stream, p.output_formatter, defaults)
    if stream and (p.n > 1 or (p.best_of or 1) > 1 or p.num_beams > 1):
        raise InvalidParameter("n, best_of and num_beams greater than 1 work only without streaming")
    generation = GenerationRequest(
        prompt=request.inputs,
        params=_sampling(p),
        stop=[*p.stop_sequences, *(p.stop if isinstance(p.stop, tuple) else ())],
        include_stop_str_in_output=p.include_stop_str_in_output,
        skip_special_tokens=p.skip_special_tokens,
        spaces_between_special_tokens=p.spaces_between_special_tokens,
        truncate=p.truncate,
        adapter=request.adapter,
    )
    return ParsedRequest(generation, p, stream, fmt, defaults.tgi_compat)


def stream_and_format(stream: bool | None, formatter: str | None, defaults: Defaults) -> tuple[bool, str]:
    """Whether to stream, and the format: json when not streaming, else jsonlines or sse."""
    fmt = formatter or defaults.output_formatter
    if fmt not in ("json", "jsonlines", "sse"):
        fmt = "json"
    if stream is None:
        stream = defaults.enable_streaming or fmt in ("jsonlines", "sse")
    if stream and fmt == "json":
        fmt = "sse" if defaults.tgi_compat else "jsonlines"
    return stream, fmt if stream else "json"
