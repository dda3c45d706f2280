"""Qwen2.5-VL's and Qwen2-VL's vision transformers: patches of ``temporal x patch x patch`` pixels
embedded by one product, 2-D rotary positions, and a merger that makes every ``merge x merge``
patches one embedding of the language model's width. Qwen2.5-VL attends within windows of merged
patches (whole pictures in the blocks ``fullatt_block_indexes`` names) with RMSNorm and a gated MLP;
Qwen2-VL attends to whole pictures with LayerNorm and a two-layer MLP. The picture's tokens come out
in raster order of the merged grid, as the prompt's placeholders are laid out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ....generation.qwen_grid import QwenGrid
from ...ops.interface import Ops
from ...ops.reference import LinearWeight
from .activations import activation

PREFIXES = ("model.visual.", "visual.")


@dataclass
class QwenBlock:
    norm1: tuple[torch.Tensor, torch.Tensor | None]
    """Its weight, and its bias for a LayerNorm (None: RMSNorm)."""
    qkv: LinearWeight
    proj: LinearWeight
    norm2: tuple[torch.Tensor, torch.Tensor | None]
    up: LinearWeight
    """gate and up fused (Qwen2.5-VL's gated MLP), or ``fc1``."""
    down: LinearWeight
    gated: bool


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm as Qwen computes it: in fp32, then back to the input's dtype before the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _norm(x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    weight, bias = norm
    return _rms(x, weight) if bias is None else F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-6)


def _runs(lengths: list[int]) -> list[tuple[int, int]]:
    """Consecutive equal lengths as ``(length, how many)``."""
    runs: list[tuple[int, int]] = []
    for n in lengths:
        if runs and runs[-1][0] == n:
            runs[-1] = (n, runs[-1][1] + 1)
        else:
            runs.append((n, 1))
    return runs


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-rotation rotary in fp32, back to the input's dtype."""
    f = x.float()
    half = f.shape[-1] // 2
    rotated = torch.cat((-f[..., half:], f[..., :half]), dim=-1)
    return (f * cos + rotated * sin).to(x.dtype)


class QwenVisionTower:
    def __init__(self, config: dict[str, Any], grid: QwenGrid, tensors: dict[str, torch.Tensor], ops: Ops):
        vision = config["vision_config"]
        self.ops = ops
        self.grid = grid
        windowed = "embed_dim" not in vision  # Qwen2-VL's tower is ``embed_dim`` wide, without windows
        self.hidden = int(vision["hidden_size"] if windowed else vision["embed_dim"])
        self.heads = int(vision.get("num_heads") or vision["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.merge = int(vision.get("spatial_merge_size", 2))
        depth = int(vision.get("depth") or vision["num_hidden_layers"])
        self.window = int(vision.get("window_size", 112)) // self.merge // int(vision.get("patch_size", 14))
        self.full = set(vision.get("fullatt_block_indexes") or ()) if windowed else set(range(depth))
        if not windowed:
            self.window = 1 << 30  # one window a picture
        self.act = activation(vision.get("hidden_act", "silu"))
        theta = float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        quarter = self.head_dim // 2
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, quarter, 2, dtype=torch.float) / quarter))
        p = next(x for x in PREFIXES if any(n.startswith(x) for n in tensors))

        def linear(name: str, bias: bool = True) -> LinearWeight:
            w = tensors.pop(p + name + ".weight")
            return ops.prepare_linear(w, tensors.pop(p + name + ".bias") if bias else None)

        embed = tensors.pop(p + "patch_embed.proj.weight")
        self.patch_embed = ops.prepare_linear(embed.reshape(embed.shape[0], -1))

        def norm(name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
            return tensors.pop(p + name + ".weight"), tensors.pop(p + name + ".bias", None)

        self.blocks = []
        for i in range(depth):
            b = f"blocks.{i}."
            if windowed:
                gate, up = (tensors.pop(p + b + f"mlp.{n}_proj.weight") for n in ("gate", "up"))
                gate_b, up_b = (tensors.pop(p + b + f"mlp.{n}_proj.bias") for n in ("gate", "up"))
                first, second = ops.prepare_linear(torch.cat([gate, up]), torch.cat([gate_b, up_b])), "mlp.down_proj"
            else:
                first, second = linear(b + "mlp.fc1"), "mlp.fc2"
            self.blocks.append(
                QwenBlock(
                    norm1=norm(b + "norm1"),
                    qkv=linear(b + "attn.qkv"),
                    proj=linear(b + "attn.proj"),
                    norm2=norm(b + "norm2"),
                    up=first,
                    down=linear(b + second),
                    gated=windowed,
                )
            )
        self.merger_norm = norm("merger.ln_q")
        self.merger_1 = linear("merger.mlp.0")
        self.merger_2 = linear("merger.mlp.2")

    def _linear(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        return self.ops.linear(x.contiguous(), w)

    def encode(self, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        """Each picture's embeddings ``(tokens, out hidden)`` from the processor's flattened patches
        ``(patches, channels * temporal * patch * patch)`` and each picture's patch grid."""
        dtype = self.merger_norm[0].dtype
        x = self._linear(pixel_values.to(dtype), self.patch_embed)
        order, windows, pictures = self._layout(grids, x.device)
        unit = self.merge * self.merge
        x = x.view(-1, unit, self.hidden)[order].reshape(-1, self.hidden)
        cos, sin = self._rotary(grids, x.device)
        cos = cos.view(-1, unit, self.head_dim)[order].reshape(-1, 1, self.head_dim)
        sin = sin.view(-1, unit, self.head_dim)[order].reshape(-1, 1, self.head_dim)
        for i, block in enumerate(self.blocks):
            h = _norm(x, block.norm1)
            x = x + self._attention(h, block, cos, sin, pictures if i in self.full else windows)
            h = self._linear(_norm(x, block.norm2), block.up)
            if block.gated:
                half = h.shape[-1] // 2
                h = self.act(h[:, :half]) * h[:, half:]
            else:
                h = self.act(h)
            x = x + self._linear(h, block.down)
        merged = _norm(x, self.merger_norm).view(-1, unit * self.hidden)
        merged = self._linear(F.gelu(self._linear(merged, self.merger_1)), self.merger_2)
        merged = merged[torch.argsort(order)]
        return list(torch.split(merged, [t * h * w // unit for t, h, w in grids]))

    def _attention(
        self, x: torch.Tensor, block: QwenBlock, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        """Bidirectional attention within each run of ``lengths`` (a window, or a whole picture)."""
        n = x.shape[0]
        q, k, v = self._linear(x, block.qkv).view(n, 3, self.heads, self.head_dim).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # (heads, n, head_dim)
        out, at = [], 0
        for length, count in _runs(lengths):  # windows of one length side by side: one call for all
            end = at + length * count
            qs, ks, vs = (t[:, at:end].reshape(self.heads, count, length, -1).transpose(0, 1) for t in (q, k, v))
            o = F.scaled_dot_product_attention(qs, ks, vs, scale=self.head_dim**-0.5)
            out.append(o.transpose(0, 1).reshape(self.heads, length * count, -1))
            at = end
        return self._linear(torch.cat(out, dim=1).transpose(0, 1).reshape(n, -1), block.proj)

    def _rotary(self, grids: list[tuple[int, int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each patch's 2-D rotary table, patches in merge-block order: the row's frequencies in the
        first quarter of the head, the column's in the second, repeated for the half rotation."""
        rows, cols = [], []
        m = self.merge
        for t, h, w in grids:
            r = torch.arange(h).view(h // m, m, 1, 1).expand(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
            c = torch.arange(w).view(1, 1, w // m, m).expand(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
            rows.append(r.repeat(t))
            cols.append(c.repeat(t))
        pos = torch.stack([torch.cat(rows), torch.cat(cols)], dim=-1).float()
        freqs = (pos[..., None] * self.inv_freq).flatten(1)
        freqs = torch.cat([freqs, freqs], dim=-1).to(device)
        return freqs.cos(), freqs.sin()

    def _layout(
        self, grids: list[tuple[int, int, int]], device: torch.device
    ) -> tuple[torch.Tensor, list[int], list[int]]:
        """The merge blocks in window order (each picture's windows in turn, each window's blocks
        row by row), the windows' and the frames' lengths in patches (a picture is one frame)."""
        order: list[torch.Tensor] = []
        windows: list[int] = []
        pictures: list[int] = []
        base, unit, size = 0, self.merge * self.merge, self.window
        for t, h, w in grids:
            gh, gw = h // self.merge, w // self.merge
            index = torch.arange(t * gh * gw).view(t, gh, gw)
            for frame in range(t):
                for top in range(0, gh, size):
                    for left in range(0, gw, size):
                        cell = index[frame, top : top + size, left : left + size].flatten()
                        order.append(cell + base)
                        windows.append(cell.numel() * unit)
            base += t * gh * gw
            pictures.extend([h * w] * t)  # a video's frames each attend within themselves
        return torch.cat(order).to(device), windows, pictures
