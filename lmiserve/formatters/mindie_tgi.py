"""MindIE's TGI-style text and stream inference on ``POST /``.

Requests are TGI's (parsed by :mod:`.tgi`, with ``inputs`` also a multimodal list). Answers
follow MindIE's document, where it differs from TGI's own routes:

- not streaming: a one-element list ``[{"details": {...}, "generated_text": ...}]``, the
  details as ``prompt_tokens, finish_reason, generated_tokens, prefill, seed, tokens``, every
  token (``prefill`` ones too) as ``{"id", "logprob", "special", "text"}``;
- streaming: SSE events ``data: {...}`` (a space after the colon), one per update, whose
  ``token.id`` is the list of the ids the update generated; the last one carries
  ``generated_text`` and, when asked for, ``details`` (``prompt_tokens, finish_reason,
  generated_tokens, seed``). With ``fullTextEnabled`` (``option.full_text_enabled``) each event's
  ``token.text`` is the whole text so far.
"""

from __future__ import annotations

from typing import Any

from ..generation.request import RequestOutput, SequenceOutput
from . import errors, json_wire, tokens
from .tgi import SSE, ParsedTgi


def _sequence(out: RequestOutput, seq: SequenceOutput, parsed: ParsedTgi, seed: int) -> dict[str, Any]:
    p = parsed.parameters
    prefill = [tokens.mindie(t) for t in out.prompt_tokens or []] if p.decoder_input_details else []
    details: dict[str, Any] = {
        "prompt_tokens": len(out.prompt_token_ids),
        **tokens.sequence_end(seq),
        "prefill": prefill,
        "seed": seed,
        "tokens": [tokens.mindie(t) for t in seq.tokens],
    }
    if p.top_n_tokens:
        details["top_tokens"] = [[tokens.mindie(a) for a in t.top or []] for t in seq.tokens]
    return details


def generate_body(out: RequestOutput, parsed: ParsedTgi) -> dict[str, Any]:
    p = parsed.parameters
    ranked = out.ranked()
    best = ranked[0]
    if not (p.details or p.decoder_input_details):
        return {"generated_text": tokens.generated_text(out, best, p.return_full_text)}
    details = _sequence(out, best, parsed, parsed.seed)
    if len(ranked) > 1:
        details["best_of_sequences"] = [
            {
                "generated_text": tokens.generated_text(out, s, p.return_full_text),
                **_sequence(out, s, parsed, parsed.seed + s.index),
            }
            for s in ranked[1:]
        ]
    return {"details": details, "generated_text": tokens.generated_text(out, best, p.return_full_text)}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json_wire.dumps(obj) + b"\n\n"


class MindieResponder(errors.ErrorsIn):
    """MindIE's ``/`` answers as a server Responder."""

    error_shape = staticmethod(errors.tgi)

    def __init__(self, parsed: ParsedTgi, full_text: bool = False):
        self.parsed = parsed
        self.full_text = full_text
        self.stream = parsed.stream
        self.media_type = SSE if parsed.stream else "application/json"
        self._first = True

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        seq = out.sequences[0]
        p = self.parsed.parameters
        new = seq.new_tokens
        if not new:
            return b""
        if self.full_text:  # MindIE's fullTextEnabled: the text so far
            text = tokens.generated_text(out, seq, p.return_full_text)
        else:
            text = "".join(t.text for t in new)
            if self._first and p.return_full_text:
                text = out.prompt + text
        self._first = False
        last = new[-1]
        token = {"id": [t.id for t in new], "text": text, "logprob": last.logprob, "special": last.special}
        event: dict[str, Any] = {"token": token, "generated_text": None, "details": None}
        if seq.finished:
            event["generated_text"] = tokens.generated_text(out, seq, p.return_full_text)
            if p.details:
                event["details"] = {
                    "prompt_tokens": len(out.prompt_token_ids),
                    **tokens.sequence_end(seq),
                    "seed": self.parsed.seed,
                }
        return _event(event)

    def body(self, outs: list[RequestOutput]) -> bytes:
        return json_wire.dumps([generate_body(outs[0], self.parsed)])
