"""What one fetch will do: the files to bring, where they go, and what makes them a model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .transfer import RemoteFile


@dataclass
class FetchOptions:
    download_dir: Path | None = None
    """Where downloads go: for Hub ids the Hugging Face cache's layout under it (default: the
    Hugging Face cache, ``HF_HOME`` / ``HF_HUB_CACHE``); for S3, ``s3/BUCKET/PREFIX`` under it."""
    revision: str | None = None
    """A Hub branch, tag or commit (``option.revision``, ``HF_REVISION``); default ``main``."""
    gguf_file: str | None = None
    """The GGUF file to take from a Hub repository that has several."""
    offline: bool = False
    """``HF_HUB_OFFLINE=1`` set by the user: Hub ids come from the cache only."""
    deadline: float | None = None
    """``time.monotonic()`` by which the download must be complete (``model_loading_timeout``)."""


@dataclass
class FetchPlan:
    what: str
    """The model id as the user gave it (for messages)."""
    directory: Path
    """Where the files land (its lock file is beside it)."""
    files: list[tuple[RemoteFile, Path]] = field(default_factory=list)
    finish: Callable[[], Path] = lambda: Path()
    """Called once every file is in place: the local path the model is read from."""
