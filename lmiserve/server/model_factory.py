"""Which kind of served model a configuration asks for, and building it."""

from __future__ import annotations

from ..config import Settings
from ..handlers.loader import HandlerLoadError, check_syntax, resolve_entry_point
from .handler_model import HandlerModel, ModelLoadError
from .registry import ServedModel

TEXT_GENERATION_HANDLER = "lmiserve.handlers.text_generation"


def build_model(settings: Settings) -> ServedModel:
    """The served model for these settings; raises ModelLoadError for what cannot start."""
    cfg = settings.model
    custom = cfg.entry_point or (settings.model_dir / "model.py").is_file()
    if not custom and cfg.rolling_batch in ("lmi", "npu", "vllm"):
        raise ModelLoadError(
            f"option.rolling_batch={cfg.rolling_batch} is not available in this build; use disable or auto"
        )
    entry = resolve_entry_point(settings.model_dir, cfg.entry_point, TEXT_GENERATION_HANDLER)
    try:
        check_syntax(settings.model_dir, entry)
    except HandlerLoadError as exc:
        raise ModelLoadError(str(exc)) from None
    return HandlerModel(settings, entry)
