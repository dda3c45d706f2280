"""The vision model of a spec's family, built from the checkpoint's tensors, and the language
model's tensors under the names the decoder reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...ops.interface import Ops
from ..spec import ModelSpec, read_config
from .llava import LlavaVision, language_model_tensors
from .llava_next import LlavaNextVision
from .pixels import PixelProcessor


class VisionModel:
    """A family's tower and projector with the model's image processor: pictures in, one
    embedding run per picture out, on the tower's device and in the language model's dtype."""

    def __init__(self, family: Any, processor: PixelProcessor, dtype: torch.dtype, device: str):
        self.family = family
        self.processor = processor
        self.dtype = dtype
        self.device = device

    def tokens_for(self, width: int, height: int) -> int:
        """The embeddings (placeholder tokens) of a picture of this size."""
        sized = getattr(self.family, "tokens_for", None)
        return self.family.tokens_per_image if sized is None else sized(width, height)

    def encode(self, images: list[Any]) -> list[torch.Tensor]:
        """PIL images (of one batch) to their embeddings ``(tokens, hidden)``."""
        if isinstance(self.family, LlavaNextVision):  # each picture its own number of tiles
            tiles = [self.processor.pixel_values([image])[0].to(self.device) for image in images]
            embeddings = self.family.encode_tiles(tiles, [image.size for image in images])
        else:
            embeddings = self.family.encode(self.processor.pixel_values(images).to(self.device))
        return [e.to(self.dtype) for e in embeddings]


def split_vision(
    spec: ModelSpec, model_dir: Path, tensors: dict[str, Any], dtype: torch.dtype, device: str, ops: Ops
) -> tuple[VisionModel | None, dict[str, Any]]:
    """``(the vision model or None, the decoder's tensors)``."""
    if not spec.vision:
        return None, tensors
    config = read_config(model_dir)["multimodal"]
    family = (LlavaNextVision if spec.vision == "llava_next" else LlavaVision)(config, tensors, ops)
    return VisionModel(family, PixelProcessor(model_dir), dtype, device), language_model_tensors(tensors)
