"""Which model class runs a spec: the generic decoder, or the subclass of a family that computes
some of it otherwise."""

from __future__ import annotations

from .decoder import DecoderModel
from .gemma import GemmaModel
from .spec import ModelSpec

MODEL_CLASSES: dict[str, type[DecoderModel]] = {"gemma2": GemmaModel, "gemma3": GemmaModel}
"""The families with a class of their own, by ``ModelSpec.architecture``."""


def decoder_class(spec: ModelSpec) -> type[DecoderModel]:
    """The model for a spec: the generic decoder unless its family has a class of its own."""
    return MODEL_CLASSES.get(spec.architecture, DecoderModel)
