"""The engine's measured speeds: prompt tokens computed per second, and the time of a decode step.

Each is smoothed exponentially over the steps that measure it (a step that computes prompt tokens
measures the first, a step of decodes only the second), so one slow step moves it only a little.
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
        self.decode_step_seconds = 0.0
        """Seconds per step of decodes only (0: not measured yet)."""

    def record(self, prefill_tokens: int, seconds: float) -> None:
        """A step that ran ``prefill_tokens`` tokens of prompts (0: decodes only) in ``seconds``."""
        if seconds <= 0.0:
            return
        if prefill_tokens:
            self.prefill_tokens_per_s = _smooth(self.prefill_tokens_per_s, prefill_tokens / seconds)
        else:
            self.decode_step_seconds = _smooth(self.decode_step_seconds, seconds)
