"""What a custom formatter sees: one request's input and its output so far.

A custom output formatter is called once per update of a request with a
:class:`TextGenerationOutput`; a custom input formatter returns a :class:`TextInput` (or a
dict with the same keys). The names follow DJL's ``djl_python.request_io`` so that formatter
code written for LMI runs unchanged; the fields are documented in docs/handlers.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..generation.request import RequestOutput, SequenceOutput, TokenOutput
from . import tokens


@dataclass
class Token:
    """One token: its id, the text it added to the output, and its log-probability."""

    id: int
    text: str
    log_prob: float | None = None
    special_token: bool = False

    def as_dict(self) -> dict[str, Any]:
        """LMI's token object: ``{"id", "text", "log_prob"}`` (plus ``special_token`` when true)."""
        return tokens.lmi_fields(self.id, self.text, self.log_prob, self.special_token)

    def as_tgi_dict(self) -> dict[str, Any]:
        """TGI's token object: ``{"id", "text", "logprob", "special"}``."""
        return tokens.tgi_fields(self.id, self.text, self.log_prob, self.special_token)


@dataclass
class Sequence:
    """One generated sequence (there are several with ``n``, ``best_of`` or beam search)."""

    index: int
    text: str = ""
    tokens: list[Token] = field(default_factory=list)
    new_tokens: list[Token] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    cumulative_log_prob: float = 0.0
    _cursor: int = field(default=0, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def has_next_token(self) -> bool:
        """True while this update's new tokens have not all been read with :meth:`get_next_token`."""
        return self._cursor < len(self.new_tokens)

    def get_next_token(self) -> tuple[Token | None, bool, bool]:
        """The next new token of this update, whether it is the sequence's first generated token,
        and whether it is its last (the sequence finished with it); ``(None, False, finished)``
        when every new token has been read."""
        if not self.has_next_token():
            return None, False, self.finished
        token = self.new_tokens[self._cursor]
        position = len(self.tokens) - len(self.new_tokens) + self._cursor
        self._cursor += 1
        last = self.finished and self._cursor == len(self.new_tokens)
        return token, position == 0, last


@dataclass
class RequestInput:
    """What was asked: the request's id, its parameters and whether it streams (None, from an
    input formatter: as the model's configuration says)."""

    request_id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    stream: bool | None = None
    adapter_name: str | None = None


@dataclass
class TextInput(RequestInput):
    """A text-generation request: a prompt (``input_text``) or chat ``messages``.

    ``input_ids`` are the prompt's token ids once the prompt is tokenized."""

    input_text: str | None = None
    messages: list[dict[str, Any]] | None = None
    input_ids: list[int] = field(default_factory=list)


@dataclass
class TextGenerationOutput:
    """One request's output so far, given to a custom output formatter at every update."""

    request_id: str
    input: TextInput
    sequences: dict[int, Sequence]
    best_sequence_index: int = 0
    prompt_tokens_details: list[Token] | None = None
    finished: bool = False

    @property
    def best_sequence(self) -> Sequence:
        return self.sequences[self.best_sequence_index]

    @property
    def text(self) -> str:
        """The best sequence's text so far."""
        return self.best_sequence.text

    @property
    def new_tokens(self) -> list[Token]:
        """The best sequence's tokens added by this update."""
        return self.best_sequence.new_tokens

    @property
    def finish_reason(self) -> str | None:
        return self.best_sequence.finish_reason


def _token(t: TokenOutput) -> Token:
    return Token(id=t.id, text=t.text, log_prob=t.logprob, special_token=t.special)


def _sequence(seq: SequenceOutput, latest: bool) -> Sequence:
    """The view of ``seq``; its new tokens only where it changed in the latest update."""
    ended = (seq.finish_reason, seq.stop_reason, seq.cumulative_logprob)
    new = [_token(t) for t in seq.new_tokens] if latest else []
    return Sequence(seq.index, seq.text, [_token(t) for t in seq.tokens], new, *ended)


def generation_output(out: RequestOutput, request: TextInput) -> TextGenerationOutput:
    """The formatter's view of ``out`` after its latest update (``request`` says what was asked)."""
    sequences = {s.index: _sequence(s, s.index == out.last_index) for s in out.sequences}
    request.input_ids = out.prompt_token_ids
    if request.input_text is None:
        request.input_text = out.prompt
    best = out.ranked()[0].index if out.finished and len(out.sequences) > 1 else out.sequences[0].index
    return TextGenerationOutput(
        request_id=out.request_id,
        input=request,
        sequences=sequences,
        best_sequence_index=best,
        prompt_tokens_details=None if out.prompt_tokens is None else [_token(t) for t in out.prompt_tokens],
        finished=out.finished,
    )
