"""LMI's "Dynamic Batch / Static Batch" schema.

Request: ``{"inputs": str | [str], "parameters": {...}, "stream": bool}``.
Response: ``[{"generated_text": ...}, ...]``, one per prompt, in order; streaming answers
``application/jsonlines`` with one ``{"outputs": [...]}`` line per step.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator

from . import json_wire
from .shapes import lmi_object
from .validation import non_empty, validated

MAX_SEED = 2**63 - 1
CONTENT_TYPE = "application/json"
STREAM_CONTENT_TYPE = "application/jsonlines"


class LmiSampling(BaseModel):
    """The sampling parameters both LMI schemas take (the rolling batch's allow a temperature of
    0 and a top_k of -1)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    do_sample: bool = False
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    temperature: float = Field(1.0, gt=0)
    repetition_penalty: float = Field(1.0, gt=0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)


class DynamicParameters(LmiSampling):
    max_new_tokens: int = Field(30, ge=1)
    return_full_text: bool = False
    stop_sequences: tuple[StrictStr, ...] = ()
    min_p: float = Field(0.0, ge=0, le=1)
    typical_p: float = Field(1.0, gt=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    decoder_input_details: bool = False
    """Each prompt token's log-probability in ``details.prefill`` (with ``details``)."""
    ignore_eos_token: bool = False
    min_new_tokens: int = Field(0, ge=0)
    stop_token_ids: tuple[int, ...] = ()
    top_n_tokens: int = Field(0, ge=0, le=20)
    """The most likely tokens at each step in ``top_tokens`` (with ``details``)."""
    details: bool = False
    """Answer each prompt with its tokens and why it ended, in the rolling-batch schema's shape
    (a streamed answer: one ``{"token": ...}`` line per token; one prompt only)."""

    @field_validator("stop_sequences", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        if v is None:
            return ()
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class DynamicRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    inputs: StrictStr | list[StrictStr]
    parameters: DynamicParameters = DynamicParameters()
    stream: bool | None = None

    @field_validator("inputs")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        return non_empty(v, "must hold at least one prompt")

    @field_validator("parameters", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return {} if v is None else v

    @property
    def prompts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)


def parse_request(body: bytes) -> DynamicRequest:
    """Parse and validate a request body.

    Raises BadRequest when the body is not a JSON object with ``inputs``, and
    ValidationFailed when a value is out of range.
    """
    data = lmi_object(body)
    return validated(DynamicRequest, data)


def format_response(texts: list[str]) -> bytes:
    return json_wire.dumps([{"generated_text": t} for t in texts])


def format_stream_line(deltas: list[str]) -> bytes:
    return json_wire.dumps({"outputs": deltas}) + b"\n"


def token_object(token_id: int, text: str, logprob: float | None) -> dict[str, Any]:
    """A token as the rolling-batch schema writes it."""
    return {"id": token_id, "text": text, "log_prob": logprob}


def detailed_answer(
    text: str,
    finish_reason: str,
    tokens: list[dict[str, Any]],
    prefill: list[dict[str, Any]] | None,
    top_tokens: list[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """One prompt's answer with ``details`` (the rolling-batch schema's, with its tokens, the
    prompt's where ``decoder_input_details`` asked and each step's top tokens where
    ``top_n_tokens`` did)."""
    details: dict[str, Any] = {"finish_reason": finish_reason, "generated_tokens": len(tokens), "tokens": tokens}
    if prefill is not None:
        details["prefill"] = prefill
    if top_tokens is not None:
        details["top_tokens"] = top_tokens
    return {"generated_text": text, "details": details}


def detailed_stream_line(
    token: dict[str, Any],
    text: str | None,
    finish_reason: str | None,
    count: int,
    prefill: list[dict[str, Any]] | None = None,
    top_tokens: list[dict[str, Any]] | None = None,
) -> bytes:
    """A streamed token with ``details`` asked: the last one carries the whole text, why it ended
    and the prompt's tokens where asked."""
    line: dict[str, Any] = {"token": token}
    if top_tokens is not None:
        line["top_tokens"] = top_tokens
    if finish_reason is not None:
        line["generated_text"] = text
        line["details"] = {"finish_reason": finish_reason, "generated_tokens": count}
        if prefill is not None:
            line["details"]["prefill"] = prefill
    return json_wire.dumps(line) + b"\n"
