"""Which weights an engine loads, and in what form: ``option.quantize`` against the checkpoint.

- A GGUF file (the model directory converted from one links it, :data:`GGUF_SOURCE`): its
  linear layers' blocks as they are (:mod:`.gguf_weights`), unless ``option.quantize=none``,
  which loads the dequantized copy.
- ``int8`` (CPUs): a dense checkpoint's linear projections quantized at load into Q8_0 blocks.
- Otherwise the dense weights in the model's dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...model_store import GGUF_SOURCE
from ..models.weights import Piece, load_state_dict
from .blocks import quantize_q8_0
from .gguf_weights import block_types, read_gguf

log = logging.getLogger("lmiserve.quant")

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a decoder layer: what ``option.quantize`` quantizes (never the
embeddings, the norms or the LM head)."""


class QuantizationError(ValueError):
    """``option.quantize`` cannot be served for this checkpoint on this device."""


def is_projection(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 3 and parts[-1] == "weight" and parts[-2] in PROJECTIONS and "layers" in parts


def quantize_projections(tensors: dict[str, Any], fn: Callable[[torch.Tensor], Any]) -> dict[str, Any]:
    """``tensors`` with every decoder layer's projection weight replaced by ``fn(weight)``."""
    return {name: fn(t) if is_projection(name) and isinstance(t, torch.Tensor) else t for name, t in tensors.items()}


def load_weights(
    model_dir: Path,
    dtype: torch.dtype,
    device: str,
    quantize: str | None = None,
    pieces: Callable[[str], Piece] | None = None,
) -> tuple[dict[str, Any], str]:
    """The model's tensors (quantized ones as :mod:`.weights` layouts) and a line saying what
    was loaded (``GET /models``' ``quantization``)."""
    source = Path(model_dir) / GGUF_SOURCE
    on_cpu = str(device).startswith("cpu")
    if quantize == "int8" and not on_cpu:
        raise QuantizationError("option.quantize=int8 runs on CPUs; on GPUs use fp8, awq or gptq")
    if source.exists() and quantize != "none":
        if quantize not in (None, "int8"):
            raise QuantizationError(
                f"option.quantize={quantize} needs a {quantize} checkpoint; a GGUF file is served from its own "
                "blocks (leave option.quantize empty) or dequantized (option.quantize=none)"
            )
        if pieces is not None:
            raise QuantizationError(
                "tensor parallelism does not shard GGUF blocks; set option.quantize=none to serve the dequantized weights"
            )
        tensors = read_gguf(source.resolve(), dtype)
        if not on_cpu:
            tensors = {k: v.to(device) for k, v in tensors.items()}
        return tensors, f"gguf blocks ({block_types(tensors) or 'none'})"
    tensors = load_state_dict(model_dir, dtype, device, pieces)
    if quantize == "int8":
        return quantize_projections(tensors, quantize_q8_0), "int8 (q8_0 blocks of 32, fp16 scales)"
    return tensors, "none"
