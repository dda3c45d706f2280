"""Pieces shared by the OpenAI-style protocols (completions, chat, Databricks)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from ..errors import GenerationError, LmiServeError
from ..generation.request import RequestOutput, SequenceOutput
from ..wire import SamplingParams
from . import errors, json_wire
from .responder import Responder
from .sampling_params import beam_search, sampled
from .validation import without_nulls

MAX_SEED = 2**64 - 1
DONE = b"data: [DONE]\n\n"
SSE = "text/event-stream"

FINISH_REASONS = {"eos_token": "stop", "stop_sequence": "stop", "length": "length", "abort": "stop"}


def finish_reason(seq: SequenceOutput) -> str | None:
    if seq.finish_reason is None:
        return None
    return FINISH_REASONS.get(seq.finish_reason, seq.finish_reason)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def sse(obj: Any) -> bytes:
    return b"data: " + json_wire.dumps(obj) + b"\n\n"


def jsonline(obj: Any) -> bytes:
    return json_wire.dumps(obj) + b"\n"


@dataclass(frozen=True)
class Framing:
    """How a stream's events are written: SSE ``data:`` events ending with ``[DONE]``, or
    JSON lines (LMI's streaming on ``/invocations``)."""

    media_type: str
    frame: Callable[[Any], bytes]
    done: bytes


SSE_FRAMING = Framing(SSE, sse, DONE)
JSONLINES_FRAMING = Framing("application/jsonlines", jsonline, b"")


@dataclass(frozen=True)
class Style:
    """What differs between the OpenAI-shaped protocols that share one responder."""

    object_name: str
    """The ``object`` of a non-streaming answer."""
    errors: Callable[[LmiServeError], tuple[int, dict[str, Any]]] = errors.openai
    framing: Framing = SSE_FRAMING
    mindie_usage: bool = True
    """Add MindIE's per-token ``batch_size`` and ``queue_wait_time`` lists to ``usage``."""
    usage_in_chunks: bool = False
    """Every streamed chunk carries the usage so far (Databricks)."""
    index_is_prompt: bool = False
    """A completion choice's ``index`` is its prompt's (Databricks), not its place among all choices."""
    offsets_across_choices: bool = False
    """Completion ``logprobs.text_offset`` counts on from the choices before (MindIE's example)."""
    reasoning_parts: bool = False
    """A reasoning model's thinking goes in ``content`` as a ``reasoning`` part (Databricks), not in
    ``reasoning_content``."""


OPENAI_COMPLETIONS = Style("text_completion", offsets_across_choices=True)
OPENAI_CHAT = Style("chat.completion")


class StyledResponder(Responder):
    """Streaming and error plumbing shared by the completions and chat responders."""

    outs: list[RequestOutput] | None = None
    truncate_on_timeout: bool = False
    """When the request's time runs out, answer what was generated so far, ending with
    ``length`` (Databricks' ``error_behavior: "truncate"``), instead of an error."""

    def __init__(self, req: Any, model: str, style: Style, id_prefix: str):
        self.req = req
        self.model = model
        self.style = style
        self.object = style.object_name
        self.stream: bool = req.stream
        self.id = new_id(id_prefix)
        self.created = now()
        self.mindie_usage = style.mindie_usage

    def envelope(self, choices: list[dict[str, Any]], object_name: str | None = None, **extra: Any) -> dict[str, Any]:
        """A response or chunk object around ``choices``: id, object, created and model first."""
        return {
            "id": self.id,
            "object": object_name or self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def start(self, outs: list[RequestOutput]) -> None:
        self.outs = outs

    def usage_body(self, outs: list[RequestOutput]) -> dict[str, Any]:
        """The answer's ``usage`` (a responder may add details)."""
        return usage(outs, mindie=self.style.mindie_usage)

    @property
    def media_type(self) -> str:
        return self.style.framing.media_type if self.stream else "application/json"

    def frame(self, obj: dict[str, Any]) -> bytes:
        if self.style.usage_in_chunks and self.outs and "usage" not in obj:
            obj = {**obj, "usage": self.usage_body(self.outs)}
        return self.style.framing.frame(obj)

    def error_chunk(self, message: str) -> bytes:
        """A failure after the stream began: the protocol's error object, with the usage so far."""
        _, body = self.style.errors(GenerationError(message))
        if self.outs:
            body = {**body, "usage": self.usage_body(self.outs)}
        return self.style.framing.frame(body) + self.style.framing.done

    def error_body(self, err: LmiServeError) -> tuple[int, bytes]:
        """The error answer; when generation had started, with the usage so far."""
        status, body = self.style.errors(err)
        if self.outs:
            body = {**body, "usage": self.usage_body(self.outs)}
        return status, json_wire.dumps(body)

    def closing_usage(self, include_usage: bool) -> dict[str, Any] | None:
        """The usage for the chunk that ends the last sequence (as MindIE streams it), unless
        a separate usage chunk follows (``stream_options.include_usage``) or every chunk has one."""
        if include_usage or self.style.usage_in_chunks or not self.outs:
            return None
        if not all(o.finished for o in self.outs):
            return None
        return self.usage_body(self.outs)


def usage(outs: list[RequestOutput], completion: bool = True, mindie: bool = True) -> dict[str, Any]:
    """Token counts for a response (every choice of every prompt), with MindIE's per-token
    ``batch_size`` and ``queue_wait_time`` (µs) lists where the engine reports its steps (left
    out, rather than filled with zeros, where a token came without them)."""
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    body: dict[str, Any] = {"prompt_tokens": prompt}
    if completion:
        generated = sum(o.generated_tokens for o in outs)
        body["completion_tokens"] = generated
        body["total_tokens"] = prompt + generated
    else:
        body["total_tokens"] = prompt
    if mindie and completion and all(o.step_stats for o in outs):
        longest = max(outs, key=lambda o: len(o.batch_sizes))
        body["batch_size"] = list(longest.batch_sizes)
        body["queue_wait_time"] = list(longest.queue_us)
    return body


class SamplingFields(BaseModel):
    """Sampling fields every OpenAI-style request shares (OpenAI, vLLM and MindIE extras)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=1e-6, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: tuple[StrictStr, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=2)
    n: int = Field(1, ge=1, le=128)
    best_of: int | None = Field(None, ge=1, le=128)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    min_tokens: int = Field(0, ge=0)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool = False
    speculate: StrictBool = True
    """lmiserve's: false turns speculative decoding off for the request (clients send it in ``extra_body``)."""

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        return without_nulls(data)

    @model_validator(mode="after")
    def _choices(self) -> SamplingFields:
        best_of = self.best_of or self.n
        if best_of < self.n:
            raise ValueError(f"best_of ({best_of}) must be at least n ({self.n})")
        if self.stream and self.best_of is not None and self.best_of != self.n and not self.use_beam_search:
            raise ValueError("when streaming, best_of must equal n")
        if self.use_beam_search and self.stop:
            raise ValueError("use_beam_search cannot be combined with stop")
        return self

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def sampling(self, max_tokens: int, logprobs: int = 0, prompt_logprobs: int | None = None) -> SamplingParams:
        asked = {"max_new_tokens": max_tokens, "logprobs": logprobs, "prompt_logprobs": prompt_logprobs}
        if self.use_beam_search:
            return beam_search(self, max(self.best_of or self.n, self.n), self.n, self.ignore_eos, **asked)
        seed = self.seed if self.seed is None else self.seed % 2**63
        return sampled(
            self,
            seed=seed,
            n=self.n,
            best_of=self.best_of or self.n,
            ignore_eos=self.ignore_eos,
            min_new_tokens=self.min_tokens,
            **asked,
        )


def chosen(out: RequestOutput, n: int) -> list[SequenceOutput]:
    """The ``n`` sequences to return: all of them, or the best ``n`` of ``best_of``."""
    if len(out.sequences) <= n:
        return out.sequences
    return sorted(out.ranked()[:n], key=lambda s: s.index)
