"""Which kind of served model a configuration asks for, and building it."""

from __future__ import annotations

from ..config import Settings
from ..handlers.loader import HandlerLoadError, check_syntax, resolve_entry_point
from ..model_store import ModelNotFound, architectures
from ..rolling_batch.models.spec import ARCHITECTURES
from .engine_model import EngineModel
from .handler_model import HandlerModel, ModelLoadError
from .registry import ServedModel

TEXT_GENERATION_HANDLER = "lmiserve.handlers.text_generation"


def _handler_model(settings: Settings, builtin: str) -> HandlerModel:
    entry = resolve_entry_point(settings.model_dir, settings.model.entry_point, builtin)
    try:
        check_syntax(settings.model_dir, entry)
    except HandlerLoadError as exc:
        raise ModelLoadError(str(exc)) from None
    return HandlerModel(settings, entry)


def build_model(settings: Settings) -> ServedModel:
    """The served model for these settings; raises ModelLoadError for what cannot start."""
    cfg = settings.model
    if cfg.entry_point or (settings.model_dir / "model.py").is_file():
        return _handler_model(settings, TEXT_GENERATION_HANDLER)
    if cfg.tensor_parallel_degree not in (1, "max"):
        raise ModelLoadError("option.tensor_parallel_degree > 1 is not available in this build")
    backend = cfg.rolling_batch
    if backend == "disable":
        return _handler_model(settings, TEXT_GENERATION_HANDLER)
    if backend in ("npu", "vllm"):
        raise ModelLoadError(f"option.rolling_batch={backend} is not available in this build; use lmi, auto or disable")
    try:
        names = architectures(cfg.model_id, settings.model_dir)
    except (ModelNotFound, OSError, ValueError) as exc:
        raise ModelLoadError(str(exc)) from None
    if any(name in ARCHITECTURES for name in names):
        return EngineModel(settings, backend="lmi")
    if backend == "lmi":
        known = ", ".join(sorted(ARCHITECTURES))
        raise ModelLoadError(
            f"option.rolling_batch=lmi does not support {names or 'this model'} (supported: {known}); "
            "use option.rolling_batch=disable"
        )
    return _handler_model(settings, TEXT_GENERATION_HANDLER)
