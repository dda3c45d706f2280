"""Where a model id, an adapter's ``src`` or a registration URL names remote files (a Hugging Face
Hub id, an ``s3://`` prefix), fetching them (:mod:`lmiserve.model_fetch`) with the model's settings:
``option.download_dir``, ``option.revision``, ``option.gguf_file`` and the user's ``HF_HUB_OFFLINE``."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..config import Settings
from ..model_fetch import FetchOptions, fetch_model, is_remote
from ..model_store import cache_root

TRUE = ("1", "on", "yes", "true")


def user_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set by the user: Hub ids from the cache only."""
    return any(os.environ.get(name, "").strip().lower() in TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def fetch_options(settings: Settings, deadline: float | None = None) -> FetchOptions:
    cfg = settings.model
    download_dir = Path(cfg.download_dir).expanduser() if cfg.download_dir else None
    return FetchOptions(
        download_dir=download_dir,
        revision=cfg.revision,
        gguf_file=cfg.gguf_file,
        offline=user_offline(),
        deadline=deadline,
    )


def s3_download_dir(options: FetchOptions) -> FetchOptions:
    """S3 prefixes go under lmiserve's cache unless ``option.download_dir`` says where."""
    if options.download_dir is None:
        return dataclasses.replace(options, download_dir=cache_root() / "downloads")
    return options


def fetch(source: str, settings: Settings, deadline: float | None = None, *, of_model: bool = True) -> Path:
    """``source``'s local path (blocking): the model's own id (``of_model``: its revision and GGUF
    file apply), else an adapter's ``src`` or a registration URL (their repositories' defaults)."""
    options = fetch_options(settings, deadline)
    if not of_model:
        options = dataclasses.replace(options, revision=None, gguf_file=None)
    if source.startswith("s3://"):
        options = s3_download_dir(options)
    return fetch_model(source, settings.model_dir, options)


def needs_fetch(settings: Settings) -> bool:
    return is_remote(settings.model.model_id, settings.model_dir)
