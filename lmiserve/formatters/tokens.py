"""A generated token as LMI's, TGI's and MindIE's JSON: one place for the token objects
every formatter (and a custom formatter's :class:`~.request_io.Token`) sends, and for a
sequence's text and how it ended."""

from __future__ import annotations

from typing import Any

from ..generation.request import RequestOutput, SequenceOutput, TokenOutput


def lmi_fields(id: int, text: str, log_prob: float | None, special: bool) -> dict[str, Any]:
    """LMI's token object: ``{"id", "text", "log_prob"}`` (plus ``special_token`` when true)."""
    out: dict[str, Any] = {"id": id, "text": text, "log_prob": log_prob}
    if special:
        out["special_token"] = True
    return out


def tgi_fields(id: int, text: str, logprob: float | None, special: bool) -> dict[str, Any]:
    """TGI's token object: ``{"id", "text", "logprob", "special"}``."""
    return {"id": id, "text": text, "logprob": logprob, "special": special}


def sequence_end(seq: SequenceOutput) -> dict[str, Any]:
    """How a sequence ended, as the TGI family's ``details`` begin: ``finish_reason`` and
    ``generated_tokens``."""
    return {"finish_reason": seq.finish_reason, "generated_tokens": len(seq.tokens)}


def generated_text(out: RequestOutput, seq: SequenceOutput, full: bool) -> str:
    """A sequence's ``generated_text``: its text, after the prompt when ``full``
    (``return_full_text``)."""
    return out.prompt + seq.text if full else seq.text


def lmi(t: TokenOutput) -> dict[str, Any]:
    return lmi_fields(t.id, t.text, t.logprob, t.special)


def tgi(t: TokenOutput) -> dict[str, Any]:
    return tgi_fields(t.id, t.text, t.logprob, t.special)


def tgi_prefill(t: TokenOutput) -> dict[str, Any]:
    """TGI's ``PrefillToken``: id, text, logprob."""
    return {"id": t.id, "text": t.text, "logprob": t.logprob}


def mindie(t: TokenOutput) -> dict[str, Any]:
    """MindIE's token object: TGI's fields in MindIE's order."""
    return {"id": t.id, "logprob": t.logprob, "special": t.special, "text": t.text}


def token(t: TokenOutput, tgi_shape: bool) -> dict[str, Any]:
    """LMI's token object, or TGI's (``tgi_compat``)."""
    return tgi(t) if tgi_shape else lmi(t)


def top(t: TokenOutput, tgi_shape: bool = True) -> list[dict[str, Any]]:
    """The most likely tokens at ``t``'s position (``top_n_tokens``)."""
    return [token(a, tgi_shape) for a in t.top or []]
