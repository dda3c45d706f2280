"""LLaVA (1.5 and models of its layout): a CLIP tower, features from one or more of its layers
(the class token dropped by the ``default`` strategy), and a two-layer projector into the
language model's embeddings. Each image is one run of placeholder tokens, as many as its
features."""

from __future__ import annotations

from typing import Any

import torch

from ...ops.interface import Ops
from ..spec import UnsupportedModel
from .activations import activation
from .clip import ClipVisionTower

PREFIXES = ("model.vision_tower.", "vision_tower.")
PROJECTOR = ("model.multi_modal_projector.", "multi_modal_projector.")
TOWERS = (*PREFIXES, *PROJECTOR, "model.visual.", "visual.", "model.image_newline", "image_newline")
"""Names of the vision side of a checkpoint, which the language model never reads."""


def _prefix(tensors: dict[str, Any], options: tuple[str, ...]) -> str:
    for p in options:
        if any(name.startswith(p) for name in tensors):
            return p
    raise KeyError(f"no weights under {' or '.join(options)}")


class LlavaVision:
    def __init__(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], ops: Ops):
        self.ops = ops
        vision = config["vision_config"]
        if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
            raise UnsupportedModel(f"LLaVA with a {vision.get('model_type')} vision tower is not supported")
        layer = config.get("vision_feature_layer", -2)
        total = int(vision["num_hidden_layers"])
        # indices into transformers' hidden states (the embeddings, then each layer's output)
        self.feature_layers = [i if i >= 0 else total + 1 + i for i in ([layer] if isinstance(layer, int) else layer)]
        self.strategy = config.get("vision_feature_select_strategy", "default")
        if self.strategy not in ("default", "full"):
            raise UnsupportedModel(f"vision_feature_select_strategy {self.strategy!r} is not supported")
        self.tower = ClipVisionTower(vision, tensors, _prefix(tensors, PREFIXES), max(self.feature_layers), ops)
        p = _prefix(tensors, PROJECTOR)
        self.linear_1 = ops.prepare_linear(tensors.pop(p + "linear_1.weight"), tensors.pop(p + "linear_1.bias", None))
        self.linear_2 = ops.prepare_linear(tensors.pop(p + "linear_2.weight"), tensors.pop(p + "linear_2.bias", None))
        self.act = activation(config.get("projector_hidden_act", "gelu"))
        self.tokens_per_image = (self.tower.image_size // self.tower.patch) ** 2 + (self.strategy == "full")

    def encode(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """Each image's embeddings ``(tokens, text hidden)`` from ``(images, 3, H, W)``."""
        states = self.tower.hidden_states(pixel_values)
        picked = [states[i] for i in self.feature_layers]
        if self.strategy == "default":
            picked = [s[:, 1:] for s in picked]
        features = picked[0] if len(picked) == 1 else torch.cat(picked, dim=-1)
        linear = self.tower._linear
        return list(linear(self.act(linear(features.contiguous(), self.linear_1)), self.linear_2))


def language_model_tensors(tensors: dict[str, Any]) -> dict[str, Any]:
    """The language model's weights under the names a text-only checkpoint gives them
    (``model.layers...``, ``lm_head.weight``): transformers' older ``language_model.model.`` /
    ``language_model.lm_head.``, its newer ``model.language_model.``, or already so (the Hub's
    Qwen2.5-VL); the tower's and projector's are left out."""
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        if name.startswith(TOWERS):
            continue
        if name.startswith("language_model.model."):
            out["model." + name[len("language_model.model.") :]] = t
        elif name.startswith("language_model.lm_head."):
            out[name[len("language_model.") :]] = t
        elif name.startswith("model.language_model."):
            out["model." + name[len("model.language_model.") :]] = t
        elif name.startswith(("lm_head.", "model.")):  # the Hub's Qwen2.5-VL: the language model's own names
            out[name] = t
    return out
