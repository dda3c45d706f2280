"""The vision model of a spec's family, built from the checkpoint's tensors, and the language
model's tensors under the names the decoder reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ....generation.qwen_grid import QwenGrid
from ...ops.interface import Ops
from ..spec import ModelSpec, UnsupportedModel, read_config
from .gemma3 import Gemma3Vision
from .llava import LlavaVision, language_model_tensors
from .llava_next import LlavaNextVision
from .pixels import PixelProcessor
from .qwen_vl import QwenVisionTower


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
        if isinstance(self.family, QwenVisionTower):
            return self.family.grid.tokens(width, height)
        sized = getattr(self.family, "tokens_for", None)
        return self.family.tokens_per_image if sized is None else sized(width, height)

    def token_grid(self, width: int, height: int) -> tuple[int, int] | None:
        """``(rows, columns)`` of a picture's tokens, for multimodal rotary positions (None: the
        model's positions are one a token)."""
        if not isinstance(self.family, QwenVisionTower):
            return None
        _, h, w = self.family.grid.patches(width, height)
        return h // self.family.merge, w // self.family.merge

    def encode(self, images: list[Any]) -> list[torch.Tensor]:
        """PIL images (of one batch) to their embeddings ``(tokens, hidden)``."""
        if isinstance(self.family, QwenVisionTower):
            out = self.processor.processor(images=images, return_tensors="pt")
            grids = [tuple(int(v) for v in g) for g in out["image_grid_thw"].tolist()]
            embeddings = self.family.encode(out["pixel_values"].to(self.device), grids)  # type: ignore[arg-type]
        elif isinstance(self.family, LlavaNextVision):  # each picture its own number of tiles
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
    processor = PixelProcessor(model_dir)
    if spec.vision == "gemma3":
        if processor.processor.to_dict().get("do_pan_and_scan"):
            raise UnsupportedModel("Gemma 3 with do_pan_and_scan=true (its crops of a picture) is not supported")
        family: Any = Gemma3Vision(config, tensors, ops)
    elif spec.vision in ("qwen2_5_vl", "qwen2_vl"):
        grid = QwenGrid.of(processor.processor.to_dict())
        family = QwenVisionTower(config, grid, tensors, ops)
    else:
        family = (LlavaNextVision if spec.vision == "llava_next" else LlavaVision)(config, tensors, ops)
    return VisionModel(family, processor, dtype, device), language_model_tensors(tensors)
