"""Percentiles and per-level summaries."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .apis import Piece


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values: list[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in (50, 90, 99)} | {
        "mean": sum(values) / len(values) if values else None
    }


@dataclass
class RequestRecord:
    start: float
    end: float = 0.0
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None
    reported: int | None = None
    """The generated tokens as the server counted them, where it said (else ``tokens`` counts them)."""
    pieces: list[str] = field(default_factory=list)
    """The generated text, where kept."""

    def arrived(self, tokens: int) -> None:
        """``tokens`` streamed tokens came now (0: a line that carried none)."""
        if tokens:
            now = time.perf_counter()
            if self.first_token is None:
                self.first_token = now
            self.token_times.append(now)
            self.tokens += tokens

    def took(self, piece: Piece, keep_text: bool = False) -> None:
        """A line of the stream was read now."""
        self.arrived(piece.tokens)
        if piece.reported is not None:
            self.reported = piece.reported
        if keep_text and piece.text:
            self.pieces.append(piece.text)

    @property
    def output_tokens(self) -> int:
        """The server's count where it gave one (a chunk may carry several tokens), else the tokens counted."""
        return self.tokens if self.reported is None else self.reported

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


def level_report(concurrency: int, records: list[RequestRecord]) -> dict[str, object]:
    ok = [r for r in records if r.error is None]
    samples = sorted({r.error for r in records if r.error})[:5]
    if not ok:
        return {"concurrency": concurrency, "requests": len(records), "errors": len(records), "error_samples": samples}
    window = max(r.end for r in ok) - min(r.start for r in ok)
    tokens = sum(r.output_tokens for r in ok)
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "errors": len(records) - len(ok),
        "error_samples": samples,
        "output_tokens": tokens,
        "seconds": window,
        "output_tokens_per_s": tokens / window,
        "requests_per_s": len(ok) / window,
        "ttft_s": summary([r.ttft for r in ok if r.ttft is not None]),
        "itl_s": summary([x for r in ok for x in r.itls]),
        "e2e_s": summary([r.end - r.start for r in ok]),
    }
