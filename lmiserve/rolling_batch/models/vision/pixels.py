"""Pictures to pixel values, by the model's own image processor (its ``preprocessor_config.json``
or ``processor_config.json``, read by transformers): resized, cropped and normalised exactly as
the model was trained to see them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class PixelProcessor:
    def __init__(self, model_dir: Path):
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(model_dir)

    def pixel_values(self, images: list[Any]) -> torch.Tensor:
        """``(images, 3, H, W)`` in fp32 for PIL images of one model's fixed input size."""
        return self.processor(images=images, return_tensors="pt")["pixel_values"]
