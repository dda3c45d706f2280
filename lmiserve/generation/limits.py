"""The per-request limits a server enforces, whatever protocol a request came in with.

Parsers check what their protocol defines; these checks bound what every protocol may ask
of the engine (the settings ``option.max_new_tokens_limit``, ``option.max_n``,
``option.max_best_of``, ``option.max_stop_sequences``, ``option.max_stop_sequence_length``).
A request over a limit is refused with :class:`~lmiserve.errors.ValidationFailed`, which
each protocol answers in its own error shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ValidationFailed
from .request import GenerationRequest

MAX_TOKEN_ID = 2**31 - 1
"""Token ids and counts beyond a signed 32-bit integer cannot name anything real."""
MINDIE_MAX_ITER_TIMES = 512
"""MindIE Server's default maxIterTimes (its configuration reference, ScheduleConfig): what a
MindIE request that names no max_tokens / max_new_tokens generates at most, unless
option.max_iter_times says otherwise."""
MAX_STOP_CHARACTERS = 32768
"""All the stop strings of one request together (MindIE's limit, 32 * 1024); it bounds the
stop-string automaton a request compiles."""


@dataclass(frozen=True)
class RequestLimits:
    max_new_tokens: int
    max_n: int = 128
    max_best_of: int = 128
    max_stop_sequences: int = 1024
    max_stop_sequence_length: int = 32768
    max_new_tokens_name: str = "max_new_tokens_limit"

    @classmethod
    def from_settings(cls, engine: object, max_model_len: int) -> RequestLimits:
        configured = getattr(engine, "max_new_tokens_limit", None)
        return cls(
            max_new_tokens=configured or max_model_len,
            max_new_tokens_name="max_new_tokens_limit" if configured else "max_model_len",
            max_n=getattr(engine, "max_n", cls.max_n),
            max_best_of=getattr(engine, "max_best_of", cls.max_best_of),
            max_stop_sequences=getattr(engine, "max_stop_sequences", cls.max_stop_sequences),
            max_stop_sequence_length=getattr(engine, "max_stop_sequence_length", cls.max_stop_sequence_length),
        )


def check(request: GenerationRequest, limits: RequestLimits) -> None:
    """Raise :class:`ValidationFailed` naming the first limit ``request`` goes beyond."""
    p = request.params
    if p.max_new_tokens > limits.max_new_tokens and not request.cap_max_new_tokens:
        raise ValidationFailed(
            f"max_new_tokens ({p.max_new_tokens}) is more than {limits.max_new_tokens_name} ({limits.max_new_tokens})"
        )
    if p.n > limits.max_n:
        raise ValidationFailed(f"n ({p.n}) is more than max_n ({limits.max_n})")
    width = max(p.best_of, p.num_beams)
    if width > limits.max_best_of:
        raise ValidationFailed(f"best_of ({width}) is more than max_best_of ({limits.max_best_of})")
    if len(request.stop) > limits.max_stop_sequences:
        raise ValidationFailed(
            f"{len(request.stop)} stop sequences are more than max_stop_sequences ({limits.max_stop_sequences})"
        )
    longest = max((len(s) for s in request.stop), default=0)
    if longest > limits.max_stop_sequence_length:
        raise ValidationFailed(
            f"a stop sequence of {longest} characters is longer than max_stop_sequence_length "
            f"({limits.max_stop_sequence_length})"
        )
    total = sum(len(s) for s in request.stop)
    if total > MAX_STOP_CHARACTERS:
        raise ValidationFailed(f"the stop sequences have {total} characters in all, more than {MAX_STOP_CHARACTERS}")
    ids = [*(request.prompt_ids or ()), *p.stop_token_ids]
    if any(not 0 <= i <= MAX_TOKEN_ID for i in ids):
        raise ValidationFailed("token ids must be between 0 and 2147483647")
