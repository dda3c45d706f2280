"""How many tokens each sequence proposes: as many as make the most tokens a second.

A step of ``n`` rows takes ``t(n)``: decode steps timed at start-up at the row counts a verify step
reaches (a CPU kernel's tile of rows shows there: four rows may cost little more than one, a fifth
a lot), plus what each row of the engine's real steps has cost beyond them (attention over real
contexts, the host's work per row), else a line fitted to the engine's decode curve as it runs. ``B`` sequences decoding make
``B`` tokens in ``t(B)``; a sequence's ``i``-th proposal is kept with probability ``alpha ** i``
(``alpha``: its acceptance, each proposal kept only if those before it were), so proposals are
offered by that expected gain, largest first, and the number taken is the one that makes the most
expected tokens per second, ``(B + gains) / (t(B + taken) + draft)``, if that is at least
:data:`MARGIN` (and a little more per row) more than without proposals, where ``draft`` is what the
proposer itself spends (its cost per token, as a share of a step, times the deepest proposal; 0 for
prompt lookup). One stream, whose step reads its weights and little else, takes most of its
proposals; a large batch, whose step is compute-bound, takes few.

``alpha`` is each sequence's own recent acceptance, smoothed. A sequence whose acceptance is too low
for even one proposal to pay at one stream stops proposing, and probes again with one proposal after a pause that
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
MARGIN = 0.15
"""Proposals are taken only where they promise this much more than the step without them, plus
:data:`MARGIN_PER_ROW` for each row of the step: the cost model's error (attention over real
contexts, the host's work per row, the API processes on the same cores) grows with the batch and
must not turn a small gain into a loss."""
MARGIN_PER_ROW = 1 / 64
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


def interpolate(table: Seq[tuple[float, float]], rows: float) -> float:
    """Seconds of a step of ``rows`` rows from measured ``(rows, seconds)`` points: linear between
    them, extended by the last two beyond."""
    if rows <= table[0][0]:
        return table[0][1]
    for (x0, y0), (x1, y1) in zip(table, table[1:]):
        if rows <= x1:
            return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = table[-2], table[-1]
    return y1 + max(0.0, (y1 - y0) / (x1 - x0)) * (rows - x1)


class AdaptivePolicy:
    def __init__(
        self,
        num_tokens: int,
        adaptive: bool = True,
        cost_ratio: float = 0.0,
        table: Seq[tuple[int, float]] = (),
    ):
        """``table``: ``(rows, seconds)`` of decode steps measured at start-up (the rows a verify step
        adds cost what those steps say; a kernel's tile of rows shows); without two points the
        engine's running decode curve is fitted with a line."""
        self.num_tokens = num_tokens
        self.adaptive = adaptive
        self.cost_ratio = cost_ratio
        self.table = sorted((float(r), t) for r, t in table) if len(table) >= 2 else []
        self.fit = (1.0, 0.0)
        self.per_row = 0.0
        """Seconds each row of a real step adds beyond the table's (attention over real contexts,
        the host's work per row), smoothed over the steps seen."""

    def observe_curve(self, curve: Seq[tuple[float, float]]) -> None:
        """The engine's latest decode curve, ``(rows, seconds)`` points."""
        self.fit = line_fit(curve)

    def step_took(self, rows: int, seconds: float) -> None:
        """A step of ``rows`` rows (decodes, verify rows and prompt tokens) took ``seconds``."""
        if self.table and rows > 0:
            extra = max(0.0, (seconds - interpolate(self.table, rows)) / rows)
            self.per_row += SMOOTHING * (extra - self.per_row)

    def seconds(self, rows: float) -> float:
        if self.table:
            return interpolate(self.table, rows) + self.per_row * rows
        a, b = self.fit
        return a + b * rows

    def row_share(self, rows: int) -> float:
        """``rho``: what one more row adds to a step of ``rows`` rows, as a share of it."""
        return max(0.0, self.seconds(rows + 1) / self.seconds(rows) - 1.0)

    def counts(self, records: Seq[SeqRecord], generated: Seq[int], rows: int) -> list[int]:
        """Proposals for each sequence (``generated``: its ``num_generated``) in a step of ``rows``
        rows before proposals: the proposals, taken by their expected gain (``alpha ** i`` for a
        sequence's ``i``-th), up to the count that makes the most tokens a second."""
        if not self.adaptive:
            return [self.num_tokens] * len(records)
        ks = [0] * len(records)
        offers: list[tuple[float, int]] = []  # (gain, sequence)
        for s, (record, done) in enumerate(zip(records, generated)):
            if record.pause:
                if done >= record.resume_at:
                    ks[s] = 1  # a probe, whatever it costs
                continue
            gain = 1.0
            for _ in range(self.num_tokens):
                gain *= record.alpha
                offers.append((gain, s))
        offers.sort(key=lambda o: -o[0])
        base = rows + sum(ks)
        step = self.seconds(base)
        draft = self.cost_ratio * self.seconds(max(rows, 1))
        plain, best_n, tokens, deepest = rows / step, 0, float(rows), 0
        best = plain * (1.0 + MARGIN + MARGIN_PER_ROW * rows)
        taken = [0] * len(records)
        for n, (gain, s) in enumerate(offers, 1):
            tokens += gain
            taken[s] += 1
            deepest = max(deepest, taken[s])
            rate = tokens / (self.seconds(base + n) + draft * deepest)
            if rate > best:
                best, best_n = rate, n
        chosen = [0] * len(records)
        for _, s in offers[:best_n]:
            chosen[s] += 1
        for s, record in enumerate(records):
            if record.pause:
                continue
            ks[s] = chosen[s]
            if chosen[s] == 0 and not self._pays_alone(record.alpha):  # too rarely kept: pause, then probe
                record.pause = 4
                record.resume_at = generated[s] + record.pause
        return ks

    def _pays_alone(self, alpha: float) -> bool:
        """Whether one proposal kept with probability ``alpha`` pays at one stream: a sequence left
        out only because the batch is large is not paused (its acceptance stays known)."""
        one = self.seconds(1)
        return (1.0 + alpha) / (self.seconds(2) + self.cost_ratio * one) > (1.0 + MARGIN) / one

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
