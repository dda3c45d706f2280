"""How many tokens each sequence proposes: as many as pay for the rows they add to the step.

A step of ``n`` token rows takes about ``a + b n`` (the engine's decode curve, measured as it runs).
``B`` sequences decoding alone make ``B`` tokens in ``a + b B``; a sequence that adds ``k`` proposed
rows, each kept with probability ``alpha`` in a row, makes ``alpha + alpha^2 + ... + alpha^k`` more
tokens in that step. Throughput grows with the ``i``-th proposal while::

    alpha ** i  >  rho + c'      with  rho = b B / (a + b B)

``rho`` is the share of a step one more row costs: small where a step reads its weights and little
else (one stream, memory-bound), near 1 where the step is compute-bound (large batches), so large
batches propose less. ``c'`` is the proposer's own cost per token as a share of the step (0 for
prompt lookup).

``alpha`` is each sequence's own recent acceptance, smoothed. A sequence whose acceptance is too low
for even one proposal stops proposing, and probes again with one proposal after a pause that
doubles each time the probe fails (up to :data:`MAX_PAUSE` tokens): its text may have changed
character, say from prose to a quotation of the prompt.

Without ``adaptive`` every sequence proposes ``num_speculative_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

PRIOR = 0.6
"""Acceptance assumed before a sequence has any record."""
SMOOTHING = 0.3
"""Weight of the newest check in a sequence's acceptance."""
MAX_PAUSE = 64
"""Longest pause (in generated tokens) of a sequence whose proposals are not kept."""


@dataclass
class SeqRecord:
    alpha: float = PRIOR
    pause: int = 0
    """Generated tokens the current pause lasts (0: proposing)."""
    resume_at: int = 0
    """``num_generated`` at which a paused sequence probes again."""


def line_fit(curve: Seq[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)`` of ``seconds = a + b * rows`` through the curve's points (least squares, ``b >= 0``);
    ``(1, 0)`` with fewer than two batch sizes."""
    if len({round(x) for x, _ in curve}) < 2:
        return 1.0, 0.0
    n = len(curve)
    mx = sum(x for x, _ in curve) / n
    my = sum(y for _, y in curve) / n
    sxx = sum((x - mx) ** 2 for x, _ in curve)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in curve) / sxx) if sxx > 0 else 0.0
    a = max(my - b * mx, 1e-9)
    return a, b


class AdaptivePolicy:
    def __init__(self, num_tokens: int, adaptive: bool = True, cost_ratio: float = 0.0):
        self.num_tokens = num_tokens
        self.adaptive = adaptive
        self.cost_ratio = cost_ratio
        self.fit = (1.0, 0.0)

    def observe_curve(self, curve: Seq[tuple[float, float]]) -> None:
        """The engine's latest decode curve, ``(rows, seconds)`` points."""
        self.fit = line_fit(curve)

    def row_share(self, rows: int) -> float:
        """``rho``: what one more row adds to a step of ``rows`` rows, as a share of it."""
        a, b = self.fit
        return b * rows / (a + b * rows)

    def counts(self, records: Seq[SeqRecord], generated: Seq[int], rows: int) -> list[int]:
        """Proposals for each sequence (``generated``: its ``num_generated``) in a step of ``rows``
        rows before proposals."""
        if not self.adaptive:
            return [self.num_tokens] * len(records)
        a, b = self.fit
        threshold = self.row_share(rows) + self.cost_ratio * (a + b) / (a + b * max(rows, 1))
        out = []
        for record, done in zip(records, generated):
            if record.pause:
                out.append(1 if done >= record.resume_at else 0)
                continue
            k, gain = 0, 1.0
            while k < self.num_tokens:
                gain *= record.alpha
                if gain <= threshold:
                    break
                k += 1
            if k == 0:  # not worth one proposal: pause, then probe
                record.pause = 4
                record.resume_at = done + record.pause
            out.append(k)
        return out

    def update(self, record: SeqRecord, proposed: int, accepted: int, generated: int) -> None:
        """A check of ``proposed`` tokens kept ``accepted`` of them (``generated``: the sequence's
        ``num_generated`` after it)."""
        if proposed <= 0:
            return
        # acceptance per token: kept ones count as successes, the first refused one as a failure
        rate = accepted / (accepted + (1 if accepted < proposed else 0))
        record.alpha += SMOOTHING * (rate - record.alpha)
        if self.adaptive and record.pause:  # a probe
            if accepted:
                record.pause, record.alpha = 0, max(record.alpha, PRIOR)
            else:
                record.pause = min(2 * record.pause, MAX_PAUSE)
                record.resume_at = generated + record.pause
