"""Which weights an engine loads, and in what form: ``option.quantize`` against the checkpoint
and what the device's ops multiply as it is (their ``native_formats``: the CPU's kernels run GGUF
blocks, CUDA's Triton kernels 4-bit groups and FP8); any other quantized weight is dequantized
at load to the model's dtype.

- A GGUF file (the directory converted from one links it, :data:`GGUF_SOURCE`): its linear
  layers' blocks as they are (:mod:`.gguf_weights`); ``option.quantize=none`` loads the
  dequantized copy.
- A checkpoint with a ``quantization_config`` (AWQ, GPTQ, FP8, compressed-tensors), or a dense
  one with ``option.quantize`` fp8 or int8: :func:`.schemes.resolve_scheme` says how it is read,
  :func:`.checkpoint.load_quantized_checkpoint` reads it.
- Otherwise the dense weights in the model's dtype.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...model_store import GGUF_SOURCE
from .checkpoint import load_quantized_checkpoint
from .gguf_weights import block_types, read_gguf
from .pieces import Piece
from .safetensors_weights import load_state_dict
from .schemes import resolve_scheme

EVERY_FORMAT = ("gguf", "int4", "fp8")
FORMAT_OF = {"int4": "int4", "fp8": "fp8", "q8_0": "gguf"}
"""The ops format that runs each scheme's weights (:attr:`~.schemes.CheckpointScheme.weights`)."""


class QuantizationError(ValueError):
    """``option.quantize`` cannot be served for this checkpoint on this device."""


def load_weights(
    model_dir: Path,
    dtype: torch.dtype,
    device: str,
    quantize: str | None = None,
    native: tuple[str, ...] = EVERY_FORMAT,
    pieces: Callable[[str], Piece] | None = None,
    embed_blocks: bool = False,
) -> tuple[dict[str, Any], str]:
    """The model's tensors (quantized ones in :mod:`.weights` layouts) and what was loaded, in
    words (``GET /models``' ``quantization`` and the start-up line). ``embed_blocks``: a GGUF
    file's token embeddings kept in their blocks (for a tied LM head with int8 activations)."""
    model_dir = Path(model_dir)
    if quantize == "int8" and "gguf" not in native:
        raise QuantizationError(
            "option.quantize=int8 runs on CPUs (the C++ block kernels); on GPUs use fp8, awq or gptq"
        )
    if quantize == "fp8" and "fp8" not in native:
        raise QuantizationError(
            "option.quantize=fp8 runs on CUDA GPUs (compute capability 8.9 or later); on CPUs use int8"
        )
    source = model_dir / GGUF_SOURCE
    if source.exists() and quantize != "none":
        return _gguf(source, dtype, device, quantize, "gguf" in native, pieces, embed_blocks)
    config = json.loads((model_dir / "config.json").read_text())
    try:
        scheme = resolve_scheme(config, quantize)
    except ValueError as exc:
        raise QuantizationError(str(exc)) from exc
    if scheme is None:
        return load_state_dict(model_dir, dtype, device, pieces), "none"
    if pieces is not None:
        raise QuantizationError(
            f"tensor parallelism does not shard quantized weights yet ({scheme.describe()}); "
            "set option.tensor_parallel_degree=1"
        )
    if FORMAT_OF.get(scheme.weights) not in native and not scheme.dequantize:
        scheme = dataclasses.replace(scheme, dequantize=True)  # these ops have no kernel for it
    return load_quantized_checkpoint(model_dir, scheme, dtype, device), scheme.describe()


def _gguf(
    source: Path,
    dtype: torch.dtype,
    device: str,
    quantize: str | None,
    blocks: bool,
    pieces: Callable[[str], Piece] | None,
    embed_blocks: bool = False,
) -> tuple[dict[str, Any], str]:
    if quantize not in (None, "int8"):
        raise QuantizationError(
            f"option.quantize={quantize} needs a {quantize} checkpoint; a GGUF file is served from its own "
            "blocks (leave option.quantize empty) or dequantized (option.quantize=none)"
        )
    if pieces is not None:
        raise QuantizationError(
            "tensor parallelism does not shard GGUF blocks; set option.quantize=none to serve the dequantized weights"
        )
    tensors = read_gguf(source.resolve(), dtype, blocks=blocks, embed_blocks=blocks and embed_blocks)
    if not str(device).startswith("cpu"):
        tensors = {name: t.to(device) for name, t in tensors.items()}
    if not blocks:
        return tensors, "gguf (dequantized at load: these ops have no block kernels)"
    return tensors, f"gguf blocks ({block_types(tensors) or 'none'})"
