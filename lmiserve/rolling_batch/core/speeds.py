"""The engine's measured speeds: prompt tokens computed per second, and the time of a decode step.

Each is smoothed exponentially over the steps that measure it (a step that computes prompt tokens
measures the first, one in which nothing decodes also the prompt speed of an idle engine, whose
prompts run whole; a step in which sequences decode the time of a decode step: with prompts
beside them or not, it is the time their next token took), so one slow step moves it only a
little.
"""

from __future__ import annotations

SMOOTHING = 0.2
"""Weight of the newest step in each smoothed value."""


def _smooth(previous: float, value: float) -> float:
    return value if previous == 0.0 else previous + SMOOTHING * (value - previous)


class StepSpeeds:
    def __init__(self) -> None:
        self.prefill_tokens_per_s = 0.0
        """Prompt tokens computed per second of step time (0: not measured yet)."""
        self.idle_prefill_tokens_per_s = 0.0
        """Prompt tokens per second of the steps in which nothing decodes (0: not measured yet)."""
        self.decode_step_seconds = 0.0
        """Seconds per step in which sequences decode, prompts computed beside them included: what
        each running sequence's next token takes under the current load (0: not measured yet)."""
        self._curve: dict[int, tuple[float, float]] = {}
        """Band (``decodes.bit_length()``) -> smoothed (batch, seconds) of decode-only steps."""

    def record(self, prefill_tokens: int, seconds: float, decodes: int = 0) -> None:
        """A step that ran ``prefill_tokens`` tokens of prompts and ``decodes`` decoding sequences
        in ``seconds``."""
        if seconds <= 0.0:
            return
        if prefill_tokens:
            self.prefill_tokens_per_s = _smooth(self.prefill_tokens_per_s, prefill_tokens / seconds)
            if not decodes:
                self.idle_prefill_tokens_per_s = _smooth(self.idle_prefill_tokens_per_s, prefill_tokens / seconds)
        if decodes or not prefill_tokens:
            self.decode_step_seconds = _smooth(self.decode_step_seconds, seconds)
        if decodes and not prefill_tokens:
            self.seed(decodes, seconds)

    def seed(self, decodes: int, seconds: float) -> None:
        """A step of ``decodes`` decoding sequences alone took ``seconds``: a point of the curve."""
        if decodes <= 0 or seconds <= 0.0:
            return
        band = decodes.bit_length()
        batch, previous = self._curve.get(band, (0.0, 0.0))
        self._curve[band] = (_smooth(batch, float(decodes)), _smooth(previous, seconds))

    def decode_curve(self) -> list[tuple[float, float]]:
        """(mean batch, seconds) of each band measured, by batch."""
        return [self._curve[band] for band in sorted(self._curve)]
