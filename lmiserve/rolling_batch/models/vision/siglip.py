"""The SigLIP vision transformer (Gemma 3's tower): patch embeddings with a bias and learned
positions (no class token), encoder layers of bidirectional attention and a two-layer MLP, and a
final LayerNorm. Its attention-pooling head is not used by the models here and is not loaded."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...ops.interface import Ops
from ...ops.reference import LinearWeight
from .activations import activation
from .clip import ClipLayer


class SiglipTower:
    def __init__(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], prefix: str, ops: Ops):
        self.ops = ops
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.patch = int(config["patch_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-6))
        self.act = activation(config.get("hidden_act", "gelu_pytorch_tanh"))
        nested = prefix + "vision_model."
        p = nested if any(name.startswith(nested) for name in tensors) else prefix

        def pair(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            return tensors.pop(p + name + ".weight"), tensors.pop(p + name + ".bias")

        def linear(name: str) -> LinearWeight:
            return ops.prepare_linear(*pair(name))

        self.patch_weight, self.patch_bias = pair("embeddings.patch_embedding")
        self.position_embedding = tensors.pop(p + "embeddings.position_embedding.weight")
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            a = f"encoder.layers.{i}."
            q, k, v = (pair(a + f"self_attn.{n}_proj") for n in "qkv")
            self.layers.append(
                ClipLayer(
                    norm1=pair(a + "layer_norm1"),
                    qkv=ops.prepare_linear(torch.cat([q[0], k[0], v[0]]), torch.cat([q[1], k[1], v[1]])),
                    out=linear(a + "self_attn.out_proj"),
                    norm2=pair(a + "layer_norm2"),
                    fc1=linear(a + "mlp.fc1"),
                    fc2=linear(a + "mlp.fc2"),
                )
            )
        self.post_norm = pair("post_layernorm")
        for name in [n for n in tensors if n.startswith(p)]:  # the pooling head
            del tensors[name]

    def _linear(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        return self.ops.linear(x.reshape(-1, x.shape[-1]).contiguous(), w).view(*x.shape[:-1], -1)

    def last_hidden_state(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``(images, patches, hidden)`` after the final LayerNorm."""
        x = F.conv2d(pixel_values.to(self.patch_weight.dtype), self.patch_weight, self.patch_bias, stride=self.patch)
        x = x.flatten(2).transpose(1, 2) + self.position_embedding
        for layer in self.layers:
            h = F.layer_norm(x, (self.hidden,), *layer.norm1, self.eps)
            b, t, _ = h.shape
            qkv = self._linear(h, layer.qkv).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            attn = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], scale=qkv.shape[-1] ** -0.5)
            x = x + self._linear(attn.transpose(1, 2).reshape(b, t, -1), layer.out)
            h = F.layer_norm(x, (self.hidden,), *layer.norm2, self.eps)
            x = x + self._linear(self.act(self._linear(h, layer.fc1)), layer.fc2)
        return F.layer_norm(x, (self.hidden,), *self.post_norm, self.eps)
