"""Qwen2-VL's and Qwen2.5-VL's picture grid, torch-free (the API process counts a picture's tokens
with it; the engine lays out the picture's positions with it): the picture is resized to multiples
of ``patch * merge`` pixels whose area lies within the processor's bounds, cut into patches, and
every ``merge x merge`` patches become one token. A video's frames are resized alike (within its
own bounds, each frame's share of a whole-video budget at most) and every ``temporal`` frames make
one grid step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class QwenGrid:
    patch: int = 14
    merge: int = 2
    temporal: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    max_video_tokens: int = 128000
    """A video's budget: 90% of this many tokens' pixels, shared among its frames (the reference
    implementation's cap, transformers' ``cap_pixels_per_frame``)."""

    @classmethod
    def of(cls, processor: dict[str, Any]) -> QwenGrid:
        """From the image processor's configuration (``size`` as transformers 5 writes it, or the
        older ``min_pixels`` and ``max_pixels``)."""
        size = processor.get("size") or {}
        return cls(
            patch=int(processor.get("patch_size", 14)),
            merge=int(processor.get("merge_size", 2)),
            temporal=int(processor.get("temporal_patch_size", 2)),
            min_pixels=int(processor.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
            max_pixels=int(processor.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
        )

    @classmethod
    def of_video(cls, video: dict[str, Any], image: QwenGrid) -> QwenGrid:
        """A video's grid from the video processor's configuration (``video_preprocessor_config.json``;
        {} when the model has none: the video processor's own bounds, 128 to 768 tokens' pixels a frame)."""
        size = video.get("size") or {}
        return cls(
            patch=int(video.get("patch_size", image.patch)),
            merge=int(video.get("merge_size", image.merge)),
            temporal=int(video.get("temporal_patch_size", image.temporal)),
            min_pixels=int(video.get("min_pixels") or size.get("shortest_edge") or 128 * 28 * 28),
            max_pixels=int(video.get("max_pixels") or size.get("longest_edge") or 768 * 28 * 28),
            max_video_tokens=int(video.get("max_video_tokens", 128000)),
        )

    def frame_size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """The ``(height, width)`` each of a video's ``frames`` is resized to."""
        unit = self.patch * self.merge
        budget = int(self.max_video_tokens * unit * unit * 0.9) * self.temporal // max(frames, 1)
        most = max(min(self.max_pixels, budget), int(self.min_pixels * 1.05))
        return QwenGrid(self.patch, self.merge, self.temporal, self.min_pixels, most).resized(height, width)

    def video_patches(self, frames: int, width: int, height: int) -> tuple[int, int, int]:
        """A video's patch grid ``(t, h, w)``: its frames, a temporal patch's worth a step (the last
        step padded with the last frame)."""
        h, w = self.frame_size(frames, height, width)
        return -(-frames // self.temporal), h // self.patch, w // self.patch

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The ``(height, width)`` the processor resizes a picture to: each side a multiple of
        ``patch * merge``, the area kept within bounds, the aspect ratio as close as that allows."""
        unit = self.patch * self.merge
        h, w = round(height / unit) * unit, round(width / unit) * unit
        if h * w > self.max_pixels:
            shrink = math.sqrt(height * width / self.max_pixels)
            h = max(unit, math.floor(height / shrink / unit) * unit)
            w = max(unit, math.floor(width / shrink / unit) * unit)
        elif h * w < self.min_pixels:
            grow = math.sqrt(self.min_pixels / (height * width))
            h, w = math.ceil(height * grow / unit) * unit, math.ceil(width * grow / unit) * unit
        return h, w

    def patches(self, width: int, height: int) -> tuple[int, int, int]:
        """The picture's patch grid ``(t, h, w)`` (a picture is one temporal patch)."""
        h, w = self.resized(height, width)
        return 1, h // self.patch, w // self.patch

    def tokens(self, width: int, height: int, frames: int = 0) -> int:
        """A picture's tokens, or (``frames`` > 0) a video's."""
        t, h, w = self.video_patches(frames, width, height) if frames else self.patches(width, height)
        return t * h * w // (self.merge * self.merge)
