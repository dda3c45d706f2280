"""A video as Qwen2-VL's and Qwen2.5-VL's tower reads it: the sampled frames (already resized in the
API process to the video grid's frame size) rescaled and normalised as the model's video processor
does, padded to whole temporal patches with the last frame, and cut into the flattened
``temporal x patch x patch`` patches of the merged grid's order; and how far apart its grid steps
lie in temporal position (Qwen2.5-VL: ``tokens_per_second`` times the seconds a step spans;
Qwen2-VL: one)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ....generation.qwen_grid import QwenGrid
from ....wire import ImageInput

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class QwenVideo:
    grid: QwenGrid
    mean: torch.Tensor
    std: torch.Tensor
    rescale: float
    tokens_per_second: float | None
    """Qwen2.5-VL's temporal scale (None: Qwen2-VL, one position a grid step)."""
    video_token_id: int

    @classmethod
    def of(cls, model_dir: Path, config: dict[str, Any], image_grid: QwenGrid, images: dict[str, Any]) -> QwenVideo:
        """From ``video_preprocessor_config.json`` where the model has one, else the video processor's
        defaults (its bounds; the image processor's normalisation)."""
        path = Path(model_dir) / "video_preprocessor_config.json"
        video = json.loads(path.read_text()) if path.exists() else {}
        vision = config.get("vision_config") or {}
        windowed = "embed_dim" not in vision  # Qwen2.5-VL; Qwen2-VL's tower has ``embed_dim``
        scale = vision.get("tokens_per_second", 4) if windowed else None
        return cls(
            grid=QwenGrid.of_video(video, image_grid),
            mean=torch.tensor(video.get("image_mean") or images.get("image_mean") or CLIP_MEAN).view(3, 1, 1),
            std=torch.tensor(video.get("image_std") or images.get("image_std") or CLIP_STD).view(3, 1, 1),
            rescale=float(video.get("rescale_factor") or images.get("rescale_factor") or 1 / 255),
            tokens_per_second=None if scale is None else float(scale),
            video_token_id=int(config.get("video_token_id", 151656)),
        )

    def time_step(self, fps: float) -> float:
        """The temporal position's step from one grid step to the next."""
        if self.tokens_per_second is None or fps <= 0:
            return 1.0
        return self.tokens_per_second * self.grid.temporal / fps

    def patches(self, video: ImageInput) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """``(patches (t * h * w, 3 * temporal * patch * patch) in fp32, (t, h, w))``."""
        g = self.grid
        frames = torch.frombuffer(bytearray(video.pixels), dtype=torch.uint8)
        x = frames.view(video.frames, video.height, video.width, 3).permute(0, 3, 1, 2).float()
        x = (x * self.rescale - self.mean) / self.std
        if pad := -video.frames % g.temporal:
            x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)])
        t, h, w = x.shape[0] // g.temporal, video.height // g.patch, video.width // g.patch
        m, p = g.merge, g.patch
        x = x.view(t, g.temporal, 3, h // m, m, p, w // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return x.reshape(t * h * w, 3 * g.temporal * p * p), (t, h, w)
