"""The CLIP vision transformer (LLaVA's tower): patch and position embeddings, a pre-norm, and
encoder layers of bidirectional attention and a two-layer MLP.

Weights are plain tensors under the tower's prefix; each layer is run with
the torch functions transformers' modules call, so the hidden states are transformers' own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ...ops.interface import Ops
from ...ops.reference import LinearWeight
from .activations import activation


@dataclass
class ClipLayer:
    norm1: tuple[torch.Tensor, torch.Tensor]
    qkv: LinearWeight
    """q, k and v projections fused (weights and biases concatenated)."""
    out: LinearWeight
    norm2: tuple[torch.Tensor, torch.Tensor]
    fc1: LinearWeight
    fc2: LinearWeight


class ClipVisionTower:
    def __init__(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], prefix: str, layers: int, ops: Ops):
        """``layers``: how many encoder layers to load and run (those up to the deepest one the
        model reads its features from). The projections run on the engine's ops (its kernels)."""
        self.ops = ops
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.patch = int(config["patch_size"])
        self.image_size = int(config["image_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-5))
        self.act = activation(config.get("hidden_act", "quick_gelu"))
        # the Hub's checkpoints nest the transformer under ``vision_model.``; transformers 5 saves it flat
        nested = prefix + "vision_model."
        p = nested if any(name.startswith(nested) for name in tensors) else prefix

        def pair(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            return tensors.pop(p + name + ".weight"), tensors.pop(p + name + ".bias")

        self.patch_embedding = tensors.pop(p + "embeddings.patch_embedding.weight")
        self.class_embedding = tensors.pop(p + "embeddings.class_embedding")
        self.position_embedding = tensors.pop(p + "embeddings.position_embedding.weight")
        self.pre_norm = pair("pre_layrnorm")
        self.layers = []
        for i in range(layers):
            a = f"encoder.layers.{i}."
            q, k, v = (pair(a + f"self_attn.{n}_proj") for n in "qkv")
            self.layers.append(
                ClipLayer(
                    norm1=pair(a + "layer_norm1"),
                    qkv=ops.prepare_linear(torch.cat([q[0], k[0], v[0]]), torch.cat([q[1], k[1], v[1]])),
                    out=ops.prepare_linear(*pair(a + "self_attn.out_proj")),
                    norm2=pair(a + "layer_norm2"),
                    fc1=ops.prepare_linear(*pair(a + "mlp.fc1")),
                    fc2=ops.prepare_linear(*pair(a + "mlp.fc2")),
                )
            )
        for name in [n for n in tensors if n.startswith(p)]:  # layers past the features, the post-norm
            del tensors[name]

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embedding.dtype

    def hidden_states(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """``(images, 1 + patches, hidden)`` after the pre-norm and after each loaded layer, as
        transformers' ``hidden_states`` (index 0: the embeddings)."""
        x = F.conv2d(pixel_values.to(self.dtype), self.patch_embedding, stride=self.patch)
        x = x.flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + self.position_embedding
        x = F.layer_norm(x, (self.hidden,), *self.pre_norm, self.eps)
        states = [x]
        for layer in self.layers:
            x = x + self._attention(F.layer_norm(x, (self.hidden,), *layer.norm1, self.eps), layer)
            h = F.layer_norm(x, (self.hidden,), *layer.norm2, self.eps)
            x = x + self._linear(self.act(self._linear(h, layer.fc1)), layer.fc2)
            states.append(x)
        return states

    def _attention(self, x: torch.Tensor, layer: ClipLayer) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self._linear(x, layer.qkv).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        head_dim = qkv.shape[-1]
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], scale=head_dim**-0.5)
        return self._linear(out.transpose(1, 2).reshape(b, t, -1), layer.out)

    def _linear(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        """The ops' product over every token of every image (rows of a 2-D input)."""
        return self.ops.linear(x.reshape(-1, x.shape[-1]).contiguous(), w).view(*x.shape[:-1], -1)
