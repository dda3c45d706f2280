"""LLaVA-NeXT: LLaVA's CLIP tower and projector over several tiles of a picture. The picture is
resized and padded to the grid resolution that fits it best (``image_grid_pinpoints``) and cut
into tower-sized tiles, plus the whole picture at tower size; the tiles' features are laid out as
one map, the padding cut off, and a learned newline embedding ends each row. So a picture's
embeddings (its placeholder tokens) depend on its size."""

from __future__ import annotations

from typing import Any

import torch

from ....generation.anyres import feature_count, grid, unpadded
from ...ops.interface import Ops
from .llava import LlavaVision

NEWLINE = ("model.image_newline", "image_newline")


class LlavaNextVision(LlavaVision):
    def __init__(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], ops: Ops):
        super().__init__(config, tensors, ops)
        self.pinpoints = [list(p) for p in config["image_grid_pinpoints"]]
        name = next(n for n in NEWLINE if n in tensors)
        self.newline = tensors.pop(name)
        self.side = self.tower.image_size // self.tower.patch

    def tokens_for(self, width: int, height: int) -> int:
        return feature_count(height, width, self.pinpoints, self.tower.image_size, self.side, self.tokens_per_image)

    def encode_tiles(self, tiles: list[torch.Tensor], sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
        """Each picture's embeddings from its tiles ``(tiles, 3, H, W)`` (the whole picture first)
        and its ``(width, height)``; the tiles of all pictures run through the tower in one batch."""
        counts = [t.shape[0] for t in tiles]
        features = torch.split(torch.stack(self.encode(torch.cat(tiles))), counts)
        return [self._pack(f, w, h) for f, (w, h) in zip(features, sizes)]

    def _pack(self, features: torch.Tensor, width: int, height: int) -> torch.Tensor:
        base, tiles = features[0], features[1:]
        rows, cols = grid(height, width, self.pinpoints, self.tower.image_size)
        side, dim = self.side, features.shape[-1]
        fmap = tiles.view(rows, cols, side, side, dim).permute(0, 2, 1, 3, 4).reshape(rows * side, cols * side, dim)
        top, bottom, left, right = unpadded(height, width, rows * side, cols * side)
        fmap = fmap[top:bottom, left:right]
        newline = self.newline.to(fmap.dtype).expand(fmap.shape[0], 1, dim)
        return torch.cat([base, torch.cat([fmap, newline], dim=1).reshape(-1, dim)])
