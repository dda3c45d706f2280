"""FP8 checkpoints (``quant_method`` "fp8", as vLLM and llm-compressor write them, and
compressed-tensors' "float-quantized" format): one linear module's tensors.

- ``weight`` ``float8_e4m3fn`` ``(out, in)``.
- ``weight_scale`` fp32: one per tensor (shape ``()`` or ``(1,)``) or one per output channel
  (``(out,)`` or ``(out, 1)``); ``w = weight * weight_scale``.
- ``input_scale`` (static activations only): left to the caller as a plain tensor.

Block-wise scales (``weight_scale_inv`` of ``(out / 128, in / 128)``, transformers'
``weight_block_size`` checkpoints) are refused: one scale per channel cannot hold them.
"""

from __future__ import annotations

import torch

from .weights import Fp8Weight

MARKER = "weight_scale"
TENSORS = ("weight", "weight_scale")


def channel_scale(scale: torch.Tensor, out_features: int) -> torch.Tensor:
    """A per-tensor or per-channel scale as fp32 ``(out,)``."""
    if scale.numel() == 1:
        return scale.float().reshape(1).expand(out_features).contiguous()
    if scale.numel() == out_features and scale.dim() <= 2 and scale.shape[0] == out_features:
        return scale.float().reshape(out_features).contiguous()
    raise ValueError(
        f"FP8 weight_scale of shape {tuple(scale.shape)} is neither per-tensor nor per-channel for "
        f"{out_features} output channels (block-wise scales are not supported)"
    )


def read(parts: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> Fp8Weight:
    """The canonical FP8 layout of one module (``parts`` keyed by tensor suffix). ``dtype`` is
    unused: FP8 scales stay fp32."""
    if "weight_scale_inv" in parts:
        raise ValueError("FP8 block-wise scales (weight_scale_inv) are not supported")
    weight, scale = parts["weight"], parts["weight_scale"]
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"FP8 weights must be float8_e4m3fn, got {weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"FP8 weight of shape {tuple(weight.shape)} is not a matrix")
    return Fp8Weight(weight.contiguous(), channel_scale(scale, weight.shape[0]))
