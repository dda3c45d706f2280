"""Cutting generated text at stop strings without ever streaming text that is later cut."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Feed text deltas; get back the text that is safe to emit.

    Text that could be the start of a stop string is held back until it either completes
    the stop string (generation ends, the stop string is dropped or kept per
    ``include_stop``) or can no longer match (it is released).
    """

    def __init__(self, stops: Sequence[str], include_stop: bool = False):
        self.stops = [s for s in stops if s]
        self.include_stop = include_stop
        self._pending = ""
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        if self.matched is not None:
            return ""
        if not self.stops:
            return delta
        text = self._pending + delta
        best = None
        for stop in self.stops:
            idx = text.find(stop)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is not None:
            idx, stop = best
            self.matched = stop
            self._pending = ""
            return text[: idx + len(stop)] if self.include_stop else text[:idx]
        hold = self._holdback(text)
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest

    def flush(self) -> str:
        """Release held-back text when generation ends for another reason."""
        out, self._pending = self._pending, ""
        return out
