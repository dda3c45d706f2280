"""Where a model id, a draft model (speculative decoding), an adapter's ``src`` or a registration URL
names remote files (a Hugging Face Hub id, an ``s3://`` prefix), fetching them
(:mod:`lmiserve.model_fetch`) with the model's settings: ``option.download_dir``, ``option.revision``,
``option.gguf_file`` and the user's ``HF_HUB_OFFLINE``."""

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


def remote_draft(settings: Settings) -> str | None:
    """The draft model or EAGLE head of speculative decoding when a Hub id or an ``s3://`` prefix
    names it (a local directory is read where it is)."""
    spec = settings.engine.speculative
    draft = spec.model if spec is not None else None
    return draft if is_remote(draft, settings.model_dir) else None


def local_draft(settings: Settings) -> Settings:
    """``settings`` with a draft model named by a path relative to the model directory (as
    ``option.model_id`` may be) named by its absolute path, which the engine's process finds
    wherever it runs; other settings as they are."""
    spec = settings.engine.speculative
    draft = spec.model if spec is not None else None
    if not draft or draft.startswith("s3://") or Path(draft).expanduser().is_absolute() or Path(draft).exists():
        return settings
    under = settings.model_dir / draft
    if not under.exists():
        return settings
    return dataclasses.replace(settings, engine=settings.engine.with_draft(str(under.resolve())))


def needs_fetch(settings: Settings) -> bool:
    """Whether the model, or its draft model, must be fetched before it is built."""
    return is_remote(settings.model.model_id, settings.model_dir) or remote_draft(settings) is not None
