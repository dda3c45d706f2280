"""What the engine reports about its load, and how long prompts take on it: the figures admission
control predicts from (:mod:`.admission_control`).

Prompt time (:func:`prefill_seconds`): on an idle engine the prompts run whole, at the prompt speed the engine
measured on steps in which nothing decodes (a figure of the hardware, not of the load, so it holds
however long ago it was measured). Beside running sequences, an engine that prefills in chunks
(``option.decode_step_prefill_tokens_per_sequence``, set by default on CPUs) takes at most the
prompt tokens it reports for a decode step, a rest within a quarter more whole: the step under
way (half of one on average), then ``ceil`` of the tokens over that chunk steps of
``decode_step_seconds``, plus the prompt tokens' own time at the idle speed (a step that carries
a prompt is that much longer than one that only decodes). An engine that reports none of this
(older engines, other backends): the tokens over the prompt speed measured on every step.

Step growth (:func:`step_scale`): how many times longer a decode step of ``batch`` sequences is
than one of the ``running`` now, read off the engine's decode curve (steps of decodes alone,
timed by batch, each point's time raised to the largest before it): between two points of it
the time runs on the straight line through them, past the last point on the line through the
last two (a step's time is a fixed part, the weights read once, plus a part per sequence), and
before the first it is the first's. With fewer than two points the step is taken to grow in
proportion to the batch: a bound from above, the only one that one measurement gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..rolling_batch.scheduling.prompt_budget import TAIL_SHARE


@dataclass(frozen=True)
class EngineLoad:
    """What the engine last reported about its queue and speed (0: not measured yet)."""

    running: int = 0
    waiting: int = 0
    prefill_tokens_per_s: float = 0.0
    decode_step_seconds: float = 0.0
    idle_prefill_tokens_per_s: float = 0.0
    """Prompt tokens per second where nothing decodes (0: not measured; :attr:`prefill_tokens_per_s` then)."""
    decode_step_prefill_tokens: int = 0
    """Prompt tokens a step that also decodes takes at most now (0: not reported)."""
    decode_curve: tuple[tuple[float, float], ...] = ()
    """(batch, seconds) of decode-only steps, by batch (empty: not reported)."""

    @property
    def idle_speed(self) -> float:
        return self.idle_prefill_tokens_per_s or self.prefill_tokens_per_s

    @classmethod
    def of(cls, stats: Any) -> EngineLoad:
        """From a ``wire.EngineStats`` (None: an engine that has reported nothing yet)."""
        if stats is None:
            return cls()
        return cls(
            running=int(stats.running),
            waiting=int(stats.waiting),
            prefill_tokens_per_s=float(getattr(stats, "prefill_tokens_per_s", 0.0) or 0.0),
            decode_step_seconds=float(getattr(stats, "decode_step_seconds", 0.0) or 0.0),
            idle_prefill_tokens_per_s=float(getattr(stats, "idle_prefill_tokens_per_s", 0.0) or 0.0),
            decode_step_prefill_tokens=int(getattr(stats, "decode_step_prefill_tokens", 0) or 0),
            decode_curve=tuple((float(b), float(t)) for b, t in getattr(stats, "decode_curve", None) or ()),
        )


def prefill_seconds(tokens: int | float, running: int, load: EngineLoad) -> float:
    """Seconds until ``tokens`` of prompts (the newcomer's last) are computed. On an idle engine
    they run whole, at the idle speed. Beside running sequences they take steps of at most
    ``decode_step_prefill_tokens`` (a rest within a quarter more taken whole): the step under
    way (half of one, on average), then theirs, each a decode step and the prompt tokens' own
    time at the idle speed. Without those figures, the prompt speed measured over every step."""
    idle = load.idle_speed
    chunk, step = load.decode_step_prefill_tokens, load.decode_step_seconds
    if running <= 0 or chunk <= 0 or step <= 0:
        return tokens / idle if idle else 0.0
    steps = max(1, math.ceil((tokens - chunk // TAIL_SHARE) / chunk))
    return step * (0.5 + steps) + (tokens / idle if idle else 0.0)


def _curve_at(curve: list[tuple[float, float]], batch: float) -> float:
    """Seconds of a decode step of ``batch`` sequences on ``curve`` (two points or more, their
    batches increasing: each is the mean of its own band)."""
    if batch <= curve[0][0]:
        return curve[0][1]
    pairs = list(zip(curve, curve[1:]))
    for (b0, t0), (b1, t1) in pairs:
        if batch <= b1:
            return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = pairs[-1]
    return t1 + (t1 - t0) * (batch - b1) / (b1 - b0)


def step_scale(load: EngineLoad, batch: int, running: int) -> float:
    """How many times longer a decode step of ``batch`` sequences is than one of ``running``
    (at least 1: only a larger batch is weighed)."""
    if running <= 0 or batch <= running:
        return 1.0
    if len(load.decode_curve) < 2:
        return batch / running
    # a larger batch never takes less than a smaller one: a dip is noise (or a point measured
    # under another load), and dividing by it would inflate every ratio above it
    curve, top = [], 0.0
    for b, t in load.decode_curve:
        top = max(top, t)
        curve.append((b, top))
    now = _curve_at(curve, running)
    return max(1.0, _curve_at(curve, batch) / now) if now > 0 else batch / running
