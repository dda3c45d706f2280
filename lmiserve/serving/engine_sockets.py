"""Where engines accept API processes beside the one that started them.

With several API processes (``api_processes``), the main one names a private directory here
(:func:`share_in`) before any engine starts; each engine then listens on a Unix socket of its
own in it (:func:`next_path`, ``InitEngine.listen_path``). With one API process, engines listen
on nothing.
"""

from __future__ import annotations

import itertools
import os

_directory: str | None = None
_count = itertools.count(1)


def share_in(directory: str | None) -> None:
    global _directory
    _directory = directory


def next_path() -> str:
    """A fresh socket path for the next engine to start ("" when engines are not shared)."""
    if _directory is None:
        return ""
    return os.path.join(_directory, f"engine-{next(_count)}.sock")
