"""LMI's "Rolling Batch" schema: the answers (see :mod:`.lmi_rolling` for the request).

Non-streaming answers ``{"generated_text": ..., "details": {...}}`` (a one-element list with
``tgi_compat``); streaming answers one ``{"token": {...}}`` line per token as jsonlines
(default) or SSE, the last line also carrying ``generated_text`` and, when asked for,
``details``. A refused or failed request gets the document's error answers.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import InvalidParameter, LmiServeError, ValidationFailed
from ..generation.request import GenerationRequest, RequestOutput, SequenceOutput
from ..wire import SamplingParams
from . import json_wire, tokens
from .lmi_rolling import JSON, Defaults, ParsedRequest, RollingParameters, stream_and_format
from .responder import Responder


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
    stream, fmt = stream_and_format(
        raw_stream if isinstance(raw_stream, bool) else None,
        formatter if isinstance(formatter, str) else None,
        defaults,
    )
    req = ParsedRequest(GenerationRequest("", SamplingParams()), RollingParameters(), stream, fmt, defaults.tgi_compat)
    if stream:
        return 400, stream_error_chunk(req, err.detail), req.content_type
    return 400, generation_error_body(req), JSON


def _sequence_details(seq: SequenceOutput, req: ParsedRequest) -> dict[str, Any]:
    tgi = req.tgi_compat
    details: dict[str, Any] = {
        **tokens.sequence_end(seq),
        "tokens": [tokens.token(t, tgi) for t in seq.tokens],
    }
    if shows_top_tokens(req.parameters):
        details["top_tokens"] = [tokens.top(t, tgi) for t in seq.tokens]
    return details


def shows_top_tokens(p: RollingParameters) -> bool:
    """``details.top_tokens`` for ``top_n_tokens`` and for ``logprobs`` alternatives, as DJL's vLLM
    path keeps vLLM's log-probabilities as each token's top tokens."""
    return bool(p.top_n_tokens or p.logprobs)


def shows_prefill(p: RollingParameters) -> bool:
    """``details.prefill`` for ``decoder_input_details``, and for ``prompt_logprobs``, which
    fills the prompt tokens' log-probabilities."""
    return p.decoder_input_details or p.prompt_logprobs is not None


def final_body(out: RequestOutput, req: ParsedRequest) -> bytes:
    """The whole non-streaming answer."""
    p, tgi = req.parameters, req.tgi_compat
    ranked = out.ranked()
    best = ranked[0]
    body: dict[str, Any] = {"generated_text": tokens.generated_text(out, best, p.return_full_text)}
    if p.details or p.decoder_input_details:
        details: dict[str, Any] = {
            **tokens.sequence_end(best),
            "inputs": out.prompt,
            "tokens": [tokens.token(t, tgi) for t in best.tokens],
        }
        if shows_top_tokens(p):
            details["top_tokens"] = [tokens.top(t, tgi) for t in best.tokens]
        if shows_prefill(p) and out.prompt_tokens is not None:
            details["prefill"] = [tokens.token(t, tgi) for t in out.prompt_tokens]
        count = p.num_beams if p.num_beams > 1 else p.n if p.n > 1 else (p.best_of or 1)
        if count > 1:
            details["best_of_sequences"] = [
                {**_sequence_details(s, req), "generated_text": tokens.generated_text(out, s, p.return_full_text)}
                for s in ranked[1:count]
            ]
        body["details"] = details
    return json_wire.dumps([body] if tgi else body)


def _frame(obj: Any, req: ParsedRequest) -> bytes:
    """A JSON line, or an SSE event: ``data:{`` as the document's sse example writes it, ``data: {``
    as its tgi_compat example does."""
    data = json_wire.dumps(obj)
    if req.output_format != "sse":
        return data + b"\n"
    return (b"data: " if req.tgi_compat else b"data:") + data + b"\n\n"


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
        if shows_top_tokens(p):
            line["top_tokens"] = tokens.top(t, tgi)
        last = i == len(new) - 1 and seq.finished
        if last:
            line["generated_text"] = tokens.generated_text(out, seq, p.return_full_text)
            if p.details or p.decoder_input_details:
                details: dict[str, Any] = {
                    **tokens.sequence_end(seq),
                    "inputs": out.prompt,
                }
                if shows_prefill(p) and out.prompt_tokens is not None:
                    details["prefill"] = [tokens.token(t, tgi) for t in out.prompt_tokens]
                line["details"] = details
            elif tgi:
                line["details"] = None
        elif tgi:
            line["generated_text"] = None
            line["details"] = None
        lines.append(_frame(line, req))
    return b"".join(lines)


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
    return json_wire.dumps({"error": message, "code": 424})


def generation_error_body(req: ParsedRequest | None) -> bytes:
    body = {
        "generated_text": "",
        "details": {"finish_reason": "error", "generated_tokens": None, "inputs": None, "tokens": None},
    }
    return json_wire.dumps([body] if req is not None and req.tgi_compat else body)


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
