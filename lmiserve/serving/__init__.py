"""The served-model runtime: models (on the engine or on handler workers), their registry,
loading and unloading, the multi-model pool, and running generation requests to an answer.

It knows no HTTP framework: ``lmiserve.server`` turns requests into calls on these names and
their :class:`Reply` into responses.
"""

from .attached_models import AttachedModels
from .engine_model import EngineModel
from .engine_sockets import share_in as share_engine_sockets
from .fetching_model import FetchingModel
from .handler_generation import HandlerGeneration, generates_text, generator_of
from .handler_model import HandlerModel, ModelLoadError
from .model_admin import ModelAdmin
from .model_chat import token_id
from .model_factory import EMBEDDING_HANDLER, TEXT_GENERATION_HANDLER, build_model
from .model_pool import MIB, Lease, ModelPool, memory_budget
from .model_sources import needs_fetch
from .registry import ModelRegistry, ServedModel
from .respond import Reply, Responder, error_reply, respond
from .response_store import ResponseStore
from .shared_state import VersionFile, describe_models
from .snapshot import ModelSnapshot

TextModel = EngineModel | HandlerGeneration
"""What generates text for a request: an engine model, or a handler model (:func:`generator_of`)."""

__all__ = [
    "AttachedModels",
    "VersionFile",
    "describe_models",
    "share_engine_sockets",
    "EMBEDDING_HANDLER",
    "MIB",
    "TEXT_GENERATION_HANDLER",
    "EngineModel",
    "FetchingModel",
    "ResponseStore",
    "HandlerGeneration",
    "HandlerModel",
    "TextModel",
    "generates_text",
    "generator_of",
    "token_id",
    "Lease",
    "ModelAdmin",
    "ModelLoadError",
    "ModelPool",
    "ModelRegistry",
    "ModelSnapshot",
    "Reply",
    "Responder",
    "ServedModel",
    "build_model",
    "error_reply",
    "memory_budget",
    "needs_fetch",
    "respond",
]
