"""The vision model of a spec's family, built from the checkpoint's tensors, and the language
model's tensors under the names the decoder reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ....generation.qwen_grid import QwenGrid
from ....wire import ImageInput
from ...ops.interface import Ops
from ..spec import ModelSpec, UnsupportedModel, read_config
from .gemma3 import Gemma3Vision
from .llava import LlavaVision, language_model_tensors
from .llava_next import LlavaNextVision
from .pixels import PixelProcessor
from .qwen3_vl import Qwen3VisionTower
from .qwen_video import QwenVideo
from .qwen_vl import QwenVisionTower


class VisionModel:
    """A family's tower and projector with the model's image processor: pictures (and, for Qwen,
    videos) in, one embedding run each out, on the tower's device and in the language model's dtype."""

    def __init__(self, family: Any, processor: PixelProcessor, dtype: torch.dtype, device: str, video: Any = None):
        self.family = family
        self.processor = processor
        self.dtype = dtype
        self.device = device
        self.video: QwenVideo | None = video
        """How the model reads a video's frames (None: it takes no video)."""

    def tokens_for(self, width: int, height: int, frames: int = 0) -> int:
        """The embeddings (placeholder tokens) of a picture of this size, or of a video's frames."""
        if isinstance(self.family, QwenVisionTower):
            grid = self.video.grid if frames and self.video is not None else self.family.grid
            return grid.tokens(width, height, frames)
        sized = getattr(self.family, "tokens_for", None)
        return self.family.tokens_per_image if sized is None else sized(width, height)

    def token_grid(self, width: int, height: int, frames: int = 0) -> tuple[int, int, int] | None:
        """``(steps, rows, columns)`` of a picture's (video's) tokens, for multimodal rotary
        positions (None: the model's positions are one a token)."""
        if not isinstance(self.family, QwenVisionTower):
            return None
        grid = self.video.grid if frames and self.video is not None else self.family.grid
        t, h, w = grid.video_patches(frames, width, height) if frames else grid.patches(width, height)
        return t, h // self.family.merge, w // self.family.merge

    def time_step(self, image: ImageInput) -> float:
        """How far apart a video's grid steps are in temporal position (1 for a picture)."""
        return 1.0 if not image.frames or self.video is None else self.video.time_step(image.fps)

    def encode(self, images: list[ImageInput]) -> list[torch.Tensor]:
        """The pictures (and videos) of one batch to their embeddings ``(tokens, hidden)``."""
        if isinstance(self.family, QwenVisionTower):
            embeddings = self._qwen(images)
        elif isinstance(self.family, LlavaNextVision):  # each picture its own number of tiles
            pictures = [_picture(image) for image in images]
            tiles = [self.processor.pixel_values([p])[0].to(self.device) for p in pictures]
            embeddings = self.family.encode_tiles(tiles, [p.size for p in pictures])
        else:
            pixels = self.processor.pixel_values([_picture(image) for image in images])
            embeddings = self.family.encode(pixels.to(self.device))
        return [e.to(self.dtype) for e in embeddings]

    def _qwen(self, images: list[ImageInput]) -> list[torch.Tensor]:
        rows: list[torch.Tensor] = []
        grids: list[tuple[int, int, int]] = []
        pictures = [_picture(image) for image in images if not image.frames]
        if pictures:
            out = self.processor.processor(images=pictures, return_tensors="pt")
            picture_rows = iter(torch.split(out["pixel_values"], [int(g.prod()) for g in out["image_grid_thw"]]))
            picture_grids = iter(tuple(int(v) for v in g) for g in out["image_grid_thw"].tolist())
        for image in images:
            if image.frames:
                assert self.video is not None
                patches, grid = self.video.patches(image)
                rows.append(patches)
                grids.append(grid)
            else:
                rows.append(next(picture_rows))
                grids.append(next(picture_grids))
        return self.family.encode(torch.cat(rows).to(self.device), grids)


def _picture(image: ImageInput) -> Any:
    from PIL import Image

    return Image.frombytes("RGB", (image.width, image.height), image.pixels)


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
    elif spec.vision == "qwen3_vl":  # pictures; its videos (frames between timestamps) are not taken yet
        family = Qwen3VisionTower(config, QwenGrid.of(processor.processor.to_dict()), tensors, ops)
    elif spec.vision in ("qwen2_5_vl", "qwen2_vl"):
        grid = QwenGrid.of(processor.processor.to_dict())
        family = QwenVisionTower(config, grid, tensors, ops)
        video = QwenVideo.of(model_dir, config, grid, processor.processor.to_dict())
        return VisionModel(family, processor, dtype, device, video), language_model_tensors(tensors)
    else:
        family = (LlavaNextVision if spec.vision == "llava_next" else LlavaVision)(config, tensors, ops)
    return VisionModel(family, processor, dtype, device), language_model_tensors(tensors)
