"""Qwen3-VL's vision transformer: ``temporal x patch x patch`` patches embedded by one product (with a
bias), a learned square table of positions resampled bilinearly (corners aligned) to each picture's
patch grid and added, the 2-D rotary positions of Qwen2-VL, LayerNorm blocks with a two-layer MLP
attending to whole frames, and a merger that makes every ``merge x merge`` patches one embedding of
the language model's width. DeepStack: the hidden states after the blocks
``deepstack_visual_indexes`` names go through mergers of their own (normalised after the merge) and
come out beside the picture's embeddings, to be added to the first layers' outputs at its tokens."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ....generation.qwen_grid import QwenGrid
from ...ops.interface import Ops
from .activations import activation
from .qwen_vl import PREFIXES, QwenBlock, QwenVisionTower, _norm


class Qwen3VisionTower(QwenVisionTower):
    def __init__(self, config: dict[str, Any], grid: QwenGrid, tensors: dict[str, torch.Tensor], ops: Ops):
        vision = config["vision_config"]
        self.ops, self.grid = ops, grid
        self.hidden = int(vision["hidden_size"])
        self.heads = int(vision["num_heads"])
        self.head_dim = self.hidden // self.heads
        self.merge = int(vision.get("spatial_merge_size", 2))
        depth = int(vision["depth"])
        self.window, self.full = 1 << 30, set(range(depth))  # every block attends to whole frames
        self.act = activation(vision.get("hidden_act", "gelu_pytorch_tanh"))
        theta = float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        quarter = self.head_dim // 2
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, quarter, 2, dtype=torch.float) / quarter))
        self.stack = [int(i) for i in vision.get("deepstack_visual_indexes") or ()]
        p = next(x for x in PREFIXES if any(n.startswith(x) for n in tensors))

        def linear(name: str) -> Any:
            return ops.prepare_linear(tensors.pop(p + name + ".weight"), tensors.pop(p + name + ".bias"))

        def norm(name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
            return tensors.pop(p + name + ".weight"), tensors.pop(p + name + ".bias")

        embed = tensors.pop(p + "patch_embed.proj.weight")
        self.patch_embed = ops.prepare_linear(
            embed.reshape(embed.shape[0], -1), tensors.pop(p + "patch_embed.proj.bias")
        )
        self.positions = tensors.pop(p + "pos_embed.weight")
        self.side = int(self.positions.shape[0] ** 0.5)
        self.blocks = [
            QwenBlock(norm1=norm(f"blocks.{i}.norm1"), qkv=linear(f"blocks.{i}.attn.qkv"),
                      proj=linear(f"blocks.{i}.attn.proj"), norm2=norm(f"blocks.{i}.norm2"),
                      up=linear(f"blocks.{i}.mlp.linear_fc1"), down=linear(f"blocks.{i}.mlp.linear_fc2"), gated=False)
            for i in range(depth)
        ]  # fmt: skip
        self.mergers = [
            (norm(f"{m}.norm"), linear(f"{m}.linear_fc1"), linear(f"{m}.linear_fc2"))
            for m in ["merger", *(f"deepstack_merger_list.{j}" for j in range(len(self.stack)))]
        ]

    def encode(self, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        """Each picture's embeddings ``(tokens, out hidden * (1 + DeepStack features))``."""
        dtype = self.mergers[0][0][0].dtype
        x = self._linear(pixel_values.to(dtype), self.patch_embed)
        x = x + self._position_table(grids).to(x.dtype)
        _, _, frames = self._layout(grids, x.device)
        cos, sin = self._rotary(grids, x.device)
        cos, sin = cos.view(-1, 1, self.head_dim), sin.view(-1, 1, self.head_dim)
        features = []
        for i, block in enumerate(self.blocks):
            x = x + self._attention(_norm(x, block.norm1), block, cos, sin, frames)
            x = x + self._linear(self.act(self._linear(_norm(x, block.norm2), block.up)), block.down)
            if i in self.stack:
                features.append(self._merged(x, self.mergers[1 + self.stack.index(i)], after=True))
        out = torch.cat([self._merged(x, self.mergers[0], after=False), *features], dim=-1)
        unit = self.merge * self.merge
        return list(torch.split(out, [t * h * w // unit for t, h, w in grids]))

    def _merged(self, x: torch.Tensor, merger: Any, after: bool) -> torch.Tensor:
        """Every ``merge x merge`` patches (consecutive rows) one embedding: normalised before the
        merge (the main merger) or after it (DeepStack's), then two products with a GELU between."""
        norm, fc1, fc2 = merger
        wide = self.hidden * self.merge * self.merge
        h = _norm(x.reshape(-1, wide), norm) if after else _norm(x, norm).reshape(-1, wide)
        return self._linear(F.gelu(self._linear(h, fc1)), fc2)

    def _position_table(self, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """Each patch's learned position (merge-block order): the square table read at the patch's
        place on an axis scaled to the table's (corners aligned), four taps weighted bilinearly."""
        side, m, out = self.side, self.merge, []
        for t, h, w in grids:
            rows, cols = _taps(h, side), _taps(w, side)
            (r0, r1, rw), (c0, c1, cw) = rows, cols
            taps = [(r0[:, None] * side + c0, (1 - rw)[:, None] * (1 - cw)), (r0[:, None] * side + c1, (1 - rw)[:, None] * cw),
                    (r1[:, None] * side + c0, rw[:, None] * (1 - cw)), (r1[:, None] * side + c1, rw[:, None] * cw)]  # fmt: skip
            table = sum(self.positions[i.flatten()] * wt.flatten()[:, None] for i, wt in taps)
            blocks = table.view(h // m, m, w // m, m, -1).permute(0, 2, 1, 3, 4).reshape(h * w, -1)
            out.append(blocks.repeat(t, 1))
        return torch.cat(out)


def _taps(n: int, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Along an axis of ``n`` patches: the table's two neighbouring indices and the second's weight."""
    src = torch.arange(n, dtype=torch.float32) * (side - 1) / max(n - 1, 1)
    floor = torch.floor(src)
    low = floor.long().clamp(0, side - 1)
    return low, (low + 1).clamp(0, side - 1), src - floor
