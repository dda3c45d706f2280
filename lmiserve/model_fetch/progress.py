"""How far a download has come: total bytes, rate and ETA, logged at a steady pace (a line redrawn
in place when standard error is a terminal), and the bytes this process has downloaded in all."""

from __future__ import annotations

import logging
import sys
import threading
import time

from .errors import human_bytes

log = logging.getLogger("lmiserve.download")

LOG_EVERY_S = 5.0

_lock = threading.Lock()
DOWNLOADED_BYTES = 0
"""Bytes this process has downloaded for models and adapters (``lmiserve_model_download_bytes``)."""


def downloaded_bytes() -> int:
    return DOWNLOADED_BYTES


class Progress:
    """One model's download: ``add`` from any thread; a reporter thread logs while it runs."""

    def __init__(self, what: str, total: int, every: float = LOG_EVERY_S) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self.every = every
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._tty = sys.stderr.isatty()
        self._thread = threading.Thread(target=self._report, name="download-progress", daemon=True)

    def __enter__(self) -> Progress:
        log.info("%s: downloading %s", self.what, human_bytes(self.total))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._tty:
            sys.stderr.write("\n")
        if exc[0] is None:
            elapsed = time.monotonic() - self.started
            log.info(
                "%s: downloaded %s in %.1f s (%s/s)",
                self.what,
                human_bytes(self.done),
                elapsed,
                human_bytes(self.done / max(elapsed, 1e-6)),
            )

    def add(self, count: int) -> None:
        global DOWNLOADED_BYTES
        with _lock:
            self.done += count
            DOWNLOADED_BYTES += count

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / elapsed
        left = max(self.total - self.done, 0)
        eta = f"{left / rate:.0f} s" if rate > 0 else "unknown"
        share = 100 * self.done / self.total if self.total else 100.0
        return (
            f"{self.what}: {human_bytes(self.done)} of {human_bytes(self.total)} ({share:.0f}%), "
            f"{human_bytes(rate)}/s, ETA {eta}"
        )

    def _report(self) -> None:
        tick = 0.5 if self._tty else self.every
        last_log = time.monotonic()
        while not self._stop.wait(tick):
            if self._tty:
                sys.stderr.write("\r" + self.line() + " " * 4)
                sys.stderr.flush()
            if time.monotonic() - last_log >= self.every:
                last_log = time.monotonic()
                if not self._tty:
                    log.info("%s", self.line())
