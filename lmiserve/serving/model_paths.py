"""Where models may be loaded from, and which models need their own code trusted first."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Settings
from ..errors import Forbidden


def model_roots(settings: Settings) -> list[Path]:
    """The directories POST /models may load from, resolved (in multi-model mode, the model root too)."""
    configured = settings.server.model_roots
    if configured and configured.strip():
        return [Path(p.strip()).expanduser().resolve() for p in configured.split(",") if p.strip()]
    if settings.server.multi_model:
        return [settings.model_dir.resolve(), Path(settings.server.multi_model_root).expanduser().resolve()]
    return [settings.model_dir.resolve()]


def check_model_path(path: Path, roots: list[Path], url: str) -> Path:
    """``path`` with symlinks resolved, if it lies under one of ``roots``; else Forbidden."""
    resolved = path.resolve()
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        raise Forbidden(f"url {url!r}: models can only be loaded from the model_roots directories")
    return resolved


def remote_code_refusal(settings: Settings) -> str | None:
    """Why the model cannot load without ``option.trust_remote_code`` (its config.json names
    modelling code of its own in ``auto_map``), or None."""
    if settings.model.trust_remote_code:
        return None
    model_id = settings.model.model_id
    directory = Path(model_id) if model_id and Path(model_id).is_dir() else settings.model_dir
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(config, dict) and config.get("auto_map"):
        return (
            f"the model in {directory} ships its own modelling code (auto_map in config.json), which runs only "
            "with option.trust_remote_code=true; set it only for code you trust"
        )
    return None
