"""Gemma 3's vision side: the SigLIP tower, then its patches average-pooled to
``mm_tokens_per_image`` (256 at 896 px), normalised (Gemma's RMSNorm, ``1 + weight``) and
projected into the language model. A picture's tokens attend to each other both ways in the
language model (:mod:`...runner.image_rows` marks their rows; :mod:`..decoder` attends)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...ops.interface import Ops
from .siglip import SiglipTower

PREFIXES = ("model.vision_tower.", "vision_tower.")
PROJECTOR = ("model.multi_modal_projector.", "multi_modal_projector.")


class Gemma3Vision:
    def __init__(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], ops: Ops):
        vision = config["vision_config"]
        prefix = next(p for p in PREFIXES if any(n.startswith(p) for n in tensors))
        self.tower = SiglipTower(vision, tensors, prefix, ops)
        p = next(x for x in PROJECTOR if any(n.startswith(x) for n in tensors))
        self.norm = tensors.pop(p + "mm_soft_emb_norm.weight")
        self.eps = float(vision.get("layer_norm_eps", 1e-6))
        projection = tensors.pop(p + "mm_input_projection_weight")  # (vision hidden, text hidden)
        self.out = int(projection.shape[1])
        self.projection = ops.prepare_linear(projection.t().contiguous())
        self.ops = ops
        self.tokens_per_image = int(config.get("mm_tokens_per_image", 256))
        self.side = int(vision["image_size"]) // int(vision["patch_size"])
        self.kernel = self.side // int(self.tokens_per_image**0.5)

    def encode(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        x = self.tower.last_hidden_state(pixel_values)
        b, _, d = x.shape
        x = x.transpose(1, 2).reshape(b, d, self.side, self.side).contiguous()
        x = F.avg_pool2d(x, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.norm.float())
        h = h.type_as(x)
        return list(self.ops.linear(h.reshape(-1, d).contiguous(), self.projection).view(b, -1, self.out))
