"""Text Generation Inference (TGI): ``/generate``, ``/generate_stream``, ``/tokenize``, ``/info``,
and the request side of MindIE's TGI-style ``/`` (its answers: :mod:`.mindie_tgi`).

Requests ``{"inputs", "parameters", "stream"}``. ``/generate`` answers TGI's
``GenerateResponse``; ``/generate_stream`` TGI's SSE events
``data:{"index", "token", "generated_text", "details"}`` (no space after ``data:``, an int
token id), as TGI's router writes them. Values are checked against the ranges the MindIE
document gives; failures answer TGI's ``{"error", "error_type": "validation"}`` (422).
``inputs`` may also be MindIE's multimodal list of ``{"type": ..., ...}`` parts.
"""

from __future__ import annotations

import json
import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator, model_validator

from ..errors import ValidationFailed
from ..generation.request import GenerationRequest, RequestOutput, SequenceOutput
from ..media import MediaRef
from ..wire import GuidedDecoding, SamplingParams
from . import errors, json_wire, tokens
from .media_parts import inputs_parts
from .shapes import json_object
from .validation import validated, without_nulls

MAX_U64 = 2**64 - 1
MAX_I32 = 2**31 - 1
MAX_STOP_SEQUENCES = 1024
MAX_BEST_OF = 16
MAX_TOP_N_TOKENS = 5
SSE = "text/event-stream"


class Grammar(BaseModel):
    """TGI's guidance: ``{"type": "json", "value": <JSON schema>}`` or ``{"type": "regex",
    "value": "<pattern>"}``; the output is constrained to match it."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    type: Literal["json", "json_object", "json_schema", "regex"]
    value: Any = None

    @model_validator(mode="after")
    def _value(self) -> Grammar:
        if self.type == "regex" and not (isinstance(self.value, str) and self.value):
            raise ValueError("a regex grammar needs the pattern as its value")
        if self.type in ("json", "json_schema") and not isinstance(self.value, (dict, str)):
            raise ValueError("a json grammar needs a JSON schema as its value")
        return self

    def guided(self) -> GuidedDecoding:
        if self.type == "regex":
            return GuidedDecoding("regex", self.value)
        if self.type == "json_object" or self.value in ({}, None):
            return GuidedDecoding("json_object")
        value = self.value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError("the json grammar's value is not valid JSON") from None
        if isinstance(value, dict) and isinstance(value.get("schema"), dict) and self.type == "json_schema":
            value = value["schema"]
        return GuidedDecoding("json_schema", json.dumps(value))


class TgiParameters(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    best_of: int | None = Field(None, gt=0, le=MAX_BEST_OF)
    decoder_input_details: bool = False
    details: bool = False
    do_sample: bool | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    max_new_tokens: int = Field(20, gt=0, le=MAX_I32)
    repetition_penalty: float | None = Field(None, gt=0)
    return_full_text: bool = False
    seed: int | None = Field(None, gt=0, le=MAX_U64)
    stop: tuple[StrictStr, ...] = ()
    temperature: float | None = Field(None, gt=1e-6)
    top_k: int | None = Field(None, gt=0, le=MAX_I32)
    top_p: float | None = Field(None, gt=1e-6, lt=1.0)
    truncate: int | None = Field(None, gt=0, le=MAX_I32)
    typical_p: float | None = Field(None, gt=0.0, le=1.0)
    watermark: bool = False
    adapter_id: str | None = Field(None, max_length=256, pattern=r"^[A-Za-z0-9._/-]*$")
    top_n_tokens: int | None = Field(None, ge=0, le=MAX_TOP_N_TOKENS)
    grammar: Grammar | None = None
    speculate: StrictBool = True  # lmiserve's: false turns speculative decoding off for the request

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        return without_nulls(data)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(v) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(not 1 <= len(s) <= 1024 for s in v):
            raise ValueError("each stop sequence must have 1 to 1024 characters")
        if sum(len(s) for s in v) > 32768:
            raise ValueError("stop sequences may have 32768 characters in all")
        return v

    @model_validator(mode="after")
    def _rules(self) -> TgiParameters:
        if (self.best_of or 1) > 1 and not self.sampling:
            raise ValueError("best_of > 1 needs sampling (do_sample, temperature, top_k, top_p or typical_p)")
        if self.grammar is not None:
            self.grammar.guided()  # a value that is not JSON fails here
        return self

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter named by ``adapter_id``; MindIE's "None" (and empty) is the base model."""
        return None if self.adapter_id in (None, "", "None") else self.adapter_id

    @property
    def sampling(self) -> bool:
        """TGI samples when asked to, or when any sampling parameter is set."""
        if self.do_sample is not None:
            return self.do_sample
        return any(v is not None for v in (self.temperature, self.top_k, self.top_p, self.typical_p))


class TgiRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    inputs: StrictStr = Field(min_length=1, max_length=4 * 1024 * 1024)
    parameters: TgiParameters = TgiParameters()
    stream: bool = False

    @field_validator("parameters", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return {} if v is None else v


class ParsedTgi:
    def __init__(self, request: TgiRequest, stream: bool, cap_max_new_tokens: bool = False):
        self.request = request
        p = request.parameters
        self.parameters = p
        self.stream = stream
        self.seed = p.seed if p.seed is not None else random.randrange(1, 2**63)
        self.generation = GenerationRequest(
            prompt=request.inputs,
            params=SamplingParams(
                max_new_tokens=p.max_new_tokens,
                do_sample=p.sampling,
                temperature=p.temperature or 1.0,
                top_k=p.top_k or 0,
                top_p=p.top_p or 1.0,
                typical_p=p.typical_p or 1.0,
                repetition_penalty=p.repetition_penalty or 1.0,
                frequency_penalty=p.frequency_penalty or 0.0,
                seed=self.seed,
                best_of=p.best_of or 1,
                n=1,
                logprobs=p.top_n_tokens or 0,
                prompt_logprobs=(p.top_n_tokens or 0) if p.decoder_input_details else None,
                guided=p.grammar.guided() if p.grammar is not None else None,
                speculate=p.speculate,
            ),
            stop=list(p.stop),
            truncate=p.truncate,
            cap_max_new_tokens=cap_max_new_tokens,
            adapter=p.adapter,
        )


def parse(body: bytes, stream: bool | None = None, mindie: bool = False) -> ParsedTgi:
    """``stream`` None: the body decides (``/``); True/False: the route decides. ``mindie``:
    MindIE's ``/``, where ``max_new_tokens`` is lowered to what the server allows
    (``min(max_iter_times, max_new_tokens)``, and what fits in the context) instead of refused."""
    data = json_object(body, what="a JSON object with 'inputs'")
    refs: list[MediaRef] = []
    offsets: list[int] = []
    if isinstance(data.get("inputs"), list):  # MindIE's multimodal inputs
        prompt, refs, offsets = inputs_parts(data["inputs"])
        data = {**data, "inputs": prompt}
    request = validated(TgiRequest, data)
    wants_stream = request.stream if stream is None else stream
    p = request.parameters
    if wants_stream and p.decoder_input_details:
        raise ValidationFailed("decoder_input_details == true is not supported when streaming tokens")
    if wants_stream and (p.best_of or 1) > 1:
        raise ValidationFailed("best_of > 1 is not supported when streaming tokens")
    if p.watermark and not mindie:  # MindIE's document accepts it and applies none; TGI's routes refuse it
        raise ValidationFailed("watermark is not supported by this server")
    parsed = ParsedTgi(request, wants_stream, cap_max_new_tokens=mindie)
    if refs:
        parsed.generation.media, parsed.generation.media_at = refs, offsets
    else:  # TGI's markdown images, taken out of the text where the model takes images
        parsed.generation.markdown_images = True
    return parsed


# --- responses ---------------------------------------------------------------------------


def _prefill(out: RequestOutput) -> list[dict[str, Any]]:
    """TGI's ``PrefillToken``: id, text, logprob."""
    if out.prompt_tokens is None:
        return []
    return [tokens.tgi_prefill(t) for t in out.prompt_tokens]


def _top_tokens(seq: SequenceOutput, parsed: ParsedTgi) -> list[list[dict[str, Any]]] | None:
    if not parsed.parameters.top_n_tokens:
        return None
    return [tokens.top(t) for t in seq.tokens]


def generate_body(out: RequestOutput, parsed: ParsedTgi) -> dict[str, Any]:
    """TGI's ``GenerateResponse``: ``generated_text``, plus ``details`` (finish_reason,
    generated_tokens, seed, prefill, tokens, then best_of_sequences and top_tokens when there
    are any) when asked for."""
    p = parsed.parameters
    best, *others = out.ranked()
    body: dict[str, Any] = {"generated_text": tokens.generated_text(out, best, p.return_full_text)}
    if p.details or p.decoder_input_details:
        details: dict[str, Any] = {
            **tokens.sequence_end(best),
            "seed": parsed.seed,
            "prefill": _prefill(out),
            "tokens": [tokens.tgi(t) for t in best.tokens],
        }
        if others:
            details["best_of_sequences"] = [
                {
                    "generated_text": tokens.generated_text(out, s, p.return_full_text),
                    **tokens.sequence_end(s),
                    "seed": parsed.seed + s.index,
                    "prefill": _prefill(out),
                    "tokens": [tokens.tgi(t) for t in s.tokens],
                    **({"top_tokens": _top_tokens(s, parsed)} if p.top_n_tokens else {}),
                }
                for s in others
            ]
        top = _top_tokens(best, parsed)
        if top is not None:
            details["top_tokens"] = top
        body["details"] = details
    return body


class TgiResponder(errors.ErrorsIn):
    """TGI's answers (``/generate``, ``/generate_stream``) as a server Responder."""

    error_shape = staticmethod(errors.tgi)
    event_prefix = b"data:"

    def __init__(self, parsed: ParsedTgi, as_list: bool = False):
        self.parsed = parsed
        self.stream = parsed.stream
        self.media_type = SSE if parsed.stream else "application/json"
        self.as_list = as_list
        self._first = True
        self._index = 0

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        seq = out.sequences[0]
        p = self.parsed.parameters
        events = []
        for i, t in enumerate(seq.new_tokens):
            tok = tokens.tgi(t)
            if self._first and p.return_full_text:
                tok["text"] = out.prompt + tok["text"]
            self._first = False
            self._index += 1
            event: dict[str, Any] = {"index": self._index, "token": tok}
            if p.top_n_tokens:
                event["top_tokens"] = tokens.top(t)
            event["generated_text"] = None
            event["details"] = None
            if seq.finished and i == len(seq.new_tokens) - 1:
                event["generated_text"] = tokens.generated_text(out, seq, p.return_full_text)
                if p.details:
                    event["details"] = {
                        **tokens.sequence_end(seq),
                        "seed": self.parsed.seed,
                    }
            events.append(b"data:" + json_wire.dumps(event) + b"\n\n")
        return b"".join(events)

    def body(self, outs: list[RequestOutput]) -> bytes:
        body = generate_body(outs[0], self.parsed)
        return json_wire.dumps([body] if self.as_list else body)


def tokenize_body(text: str, encoding: Any) -> bytes:
    """``/tokenize``: each token with its text and character offsets."""
    ids = encoding["input_ids"]
    offsets = encoding["offset_mapping"]
    return json_wire.dumps(
        [{"id": i, "text": text[start:stop], "start": start, "stop": stop} for i, (start, stop) in zip(ids, offsets)]
    )
