"""Which kind of served model a configuration asks for, and building it."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from collections.abc import Callable

from ..config import Settings
from ..devices import npu_available
from ..handlers.custom_formatters import formatters_only, load_custom_formatters
from ..handlers.loader import USER_MODULE, HandlerLoadError, check_syntax, resolve_entry_point, user_module
from ..model_store import ModelNotFound, architectures
from ..rolling_batch.models.architectures import ARCHITECTURES
from .engine_model import EngineModel
from .handler_model import HandlerModel, ModelLoadError
from .model_paths import remote_code_refusal
from .registry import ServedModel

log = logging.getLogger("lmiserve.serving")

TEXT_GENERATION_HANDLER = "lmiserve.handlers.text_generation"
EMBEDDING_HANDLER = "lmiserve.handlers.embedding"
EMBEDDING_BATCH_SIZE = 32
EMBEDDING_BATCH_DELAY_MS = 10


def is_embedding_model(names: list[str]) -> bool:
    """Encoders (BertModel, XLMRobertaModel, ...): no language-model head."""
    return bool(names) and all(n.endswith("Model") and "For" not in n for n in names)


def _embedding_settings(settings: Settings) -> Settings:
    """Batch embeddings by default: many small requests make one forward pass."""
    update = {}
    if str(settings.sources["batch_size"]) == "default":
        update["batch_size"] = EMBEDDING_BATCH_SIZE
    if str(settings.sources["max_batch_delay"]) == "default":
        update["max_batch_delay"] = EMBEDDING_BATCH_DELAY_MS
    return dataclasses.replace(settings, model=settings.model.model_copy(update=update)) if update else settings


def _handler_model(settings: Settings, builtin: str) -> HandlerModel:
    entry = resolve_entry_point(settings.model_dir, settings.model.entry_point, builtin)
    try:
        check_syntax(settings.model_dir, entry)
    except HandlerLoadError as exc:
        raise ModelLoadError(str(exc)) from None
    return HandlerModel(settings, entry)


def _embedding(model_id: str | None, settings: Settings) -> bool:
    try:
        return is_embedding_model(architectures(model_id, settings.model_dir))
    except (ModelNotFound, OSError, ValueError):
        return False


def _vllm_model(settings: Settings) -> EngineModel:
    """Generation by an installed vLLM (any architecture it supports, sharded as it shards)."""
    from ..rolling_batch.vllm.engine_info import NOT_INSTALLED, vllm_installed

    if not vllm_installed():
        raise ModelLoadError(NOT_INSTALLED)
    return EngineModel(settings, backend="vllm")


def _one_device(settings: Settings, what: str) -> None:
    """Only our engine shards a model across devices; refuse tensor parallelism elsewhere."""
    if settings.model.tensor_parallel_degree not in (1, "max"):
        raise ModelLoadError(
            f"option.tensor_parallel_degree > 1 needs the lmi engine (option.rolling_batch=lmi, npu or auto); {what}"
        )


def _check_npu(settings: Settings) -> None:
    """``option.rolling_batch=npu`` needs torch_npu and a visible Ascend NPU; say which is missing."""
    if settings.model.device not in ("auto", "npu") and not settings.model.device.startswith("npu:"):
        raise ModelLoadError(
            f"option.rolling_batch=npu runs on an NPU, but option.device is {settings.model.device}; use npu or npu:N"
        )
    if importlib.util.find_spec("torch_npu") is None:
        raise ModelLoadError(
            "option.rolling_batch=npu needs torch_npu (and Ascend's CANN toolkit), which is not installed; "
            "use the NPU image or option.rolling_batch=lmi"
        )
    if not npu_available():
        raise ModelLoadError(
            "option.rolling_batch=npu found no usable Ascend NPU (torch.npu.is_available() is false): check the "
            "/dev/davinci* devices given to the container, the driver and ASCEND_RT_VISIBLE_DEVICES"
        )


def _user_handler(settings: Settings) -> bool:
    """A handler serves the model: option.entryPoint, or a model's own module that is more than
    custom formatters (a model.py with only formatters keeps the rolling-batch engine)."""
    cfg = settings.model
    if cfg.entry_point:
        return True
    name = user_module(settings.model_dir)
    if name == USER_MODULE and formatters_only(settings.model_dir, cfg.handler, cfg.output_formatter):
        return False
    return name is not None


def build_model(settings: Settings) -> ServedModel:
    """The served model for these settings; raises ModelLoadError for what cannot start."""
    refusal = None if _user_handler(settings) else remote_code_refusal(settings)
    if refusal:
        raise ModelLoadError(refusal)
    model = _build_model(settings)
    if isinstance(model, EngineModel):
        try:
            model.custom_formatters = load_custom_formatters(settings.model_dir, settings.model.output_formatter)
        except HandlerLoadError as exc:
            raise ModelLoadError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the user's model.py failed while importing
            raise ModelLoadError(f"importing model.py failed: {type(exc).__name__}: {exc}") from None
    return model


def _dynamic_batch(settings: Settings) -> ServedModel:
    """``disable``: transformers ``generate`` behind the dynamic batcher (an embedding model still
    gets the embedding handler)."""
    if _embedding(settings.model.model_id, settings):
        return _by_architecture(settings)
    _one_device(settings, "option.rolling_batch=disable runs transformers generate on one device")
    return _handler_model(settings, TEXT_GENERATION_HANDLER)


def _npu_engine(settings: Settings) -> ServedModel:
    _check_npu(settings)
    return _by_architecture(settings)


def _by_architecture(settings: Settings) -> ServedModel:
    """Our engine for the architectures it runs; the embedding handler for encoders; elsewhere
    (``auto``) an installed vLLM, else transformers behind the dynamic batcher, or a refusal
    (``lmi``, ``npu``). The log says which and why."""
    cfg = settings.model
    backend = cfg.rolling_batch
    try:
        names = architectures(cfg.model_id, settings.model_dir)
    except (ModelNotFound, OSError, ValueError) as exc:
        raise ModelLoadError(str(exc)) from None
    if is_embedding_model(names):
        if backend == "lmi":
            raise ModelLoadError(f"{names} is an embedding model: option.rolling_batch=lmi does not apply")
        _one_device(settings, f"{names} is an embedding model, served on one device")
        return HandlerModel(_embedding_settings(settings), EMBEDDING_HANDLER)
    what = ", ".join(names) or "this model"
    if any(name in ARCHITECTURES for name in names):
        log.info("option.rolling_batch=%s: %s runs on lmiserve's engine", backend, what)
        return EngineModel(settings, backend="lmi")
    if backend in ("lmi", "npu"):
        known = ", ".join(sorted(ARCHITECTURES))
        raise ModelLoadError(
            f"option.rolling_batch={backend} does not support {names or 'this model'} (supported: {known}); "
            "use option.rolling_batch=disable"
        )
    if _vllm_installed():
        log.info(
            "option.rolling_batch=auto: %s is not an architecture of lmiserve's engine; the installed vLLM serves it",
            what,
        )
        return EngineModel(settings, backend="vllm")
    _one_device(settings, f"the lmi engine does not support {names or 'this model'}")
    log.warning(
        "option.rolling_batch=auto: %s is not an architecture of lmiserve's engine and vLLM is not installed: "
        "transformers generate serves it behind the dynamic batcher, without continuous batching or a paged KV "
        "cache (typically 10-20x slower under concurrent load on a GPU). Install vLLM (the CUDA image's "
        "INSTALL_VLLM=1 build argument) for continuous batching",
        what,
    )
    return _handler_model(settings, TEXT_GENERATION_HANDLER)


def _vllm_installed() -> bool:
    from ..rolling_batch.vllm.engine_info import vllm_installed

    return vllm_installed()


BACKENDS: dict[str, Callable[[Settings], ServedModel]] = {
    "auto": _by_architecture,
    "lmi": _by_architecture,
    "npu": _npu_engine,
    "vllm": _vllm_model,
    "disable": _dynamic_batch,
}
"""What builds the model for each ``option.rolling_batch`` (a model.py handler comes first)."""


def _build_model(settings: Settings) -> ServedModel:
    if settings.model.pipeline_parallel_degree > 1 and (
        settings.model.rolling_batch != "vllm" or _user_handler(settings)
    ):
        raise ModelLoadError(
            f"option.pipeline_parallel_degree={settings.model.pipeline_parallel_degree} needs "
            "option.rolling_batch=vllm (vLLM's pipeline parallelism); lmiserve's engine shards by "
            "option.tensor_parallel_degree only"
        )
    if _user_handler(settings):
        return _handler_model(settings, TEXT_GENERATION_HANDLER)
    return BACKENDS[settings.model.rolling_batch](settings)
