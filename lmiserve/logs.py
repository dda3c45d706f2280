"""Log format shared by the server and its worker processes."""

from __future__ import annotations

import logging
import sys


def configure(level: str = "info", tag: str = "") -> None:
    prefix = f"[{tag}] " if tag else ""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
