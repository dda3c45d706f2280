"""Debug lines that time the phases of an engine start: where a start (or a restart) spends its time."""

from __future__ import annotations

import logging
import time


class PhaseLog:
    """``done(name)`` logs, at debug level, the seconds since the previous phase ended."""

    def __init__(self, log: logging.Logger, what: str):
        self.log = log
        self.what = what
        self._last = time.monotonic()

    def done(self, phase: str) -> None:
        now = time.monotonic()
        self.log.debug("%s: %s in %.2f s", self.what, phase, now - self._last)
        self._last = now
