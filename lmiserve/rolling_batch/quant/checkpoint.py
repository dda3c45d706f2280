"""Reading a quantized Hugging Face checkpoint into the canonical layouts.

Every ``*.safetensors`` file of the model directory is read. Each linear module stored
quantized (recognised by its own tensors: ``qweight`` for AWQ and GPTQ, ``weight_packed`` for
compressed-tensors int4, an e4m3 ``weight`` with a ``weight_scale`` for FP8) becomes ONE entry
``<module>.weight`` holding its :class:`~.weights.QuantizedWeight`; modules a checkpoint
leaves dense (``modules_to_not_convert``, ``ignore``, the LM head) and every other tensor are
returned as they are, floating ones cast to the model dtype (activation and KV-cache scales
stay fp32). Plain checkpoints under ``option.quantize`` fp8/int8 are read dense, then their
projections quantized (:mod:`.onthefly`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from . import awq, compressed_tensors, fp8_checkpoint, gptq
from .onthefly import ON_THE_FLY, quantize_linear_weights
from .safetensors_weights import load_state_dict
from .schemes import CheckpointScheme
from .weights import QuantizedWeight, is_quantized

Loaded = dict[str, "torch.Tensor | QuantizedWeight"]

READERS: dict[tuple[str, str], ModuleType] = {
    ("awq", "int4"): awq,
    ("gptq", "int4"): gptq,
    ("compressed-tensors", "int4"): compressed_tensors,
    ("compressed-tensors", "fp8"): fp8_checkpoint,
    ("fp8", "fp8"): fp8_checkpoint,
}
FP32_SUFFIXES = ("input_scale", "k_scale", "v_scale", "output_scale")
"""Tensors kept in fp32 whatever the model dtype (activation and KV-cache scales)."""


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, as stored."""
    return load_state_dict(model_dir, None)


def quantized_modules(tensors: dict[str, torch.Tensor], marker: str, fp8: bool) -> list[str]:
    """The prefixes of the modules stored quantized (named ``<prefix>.<marker>``)."""
    suffix = "." + marker
    prefixes = [name[: -len(suffix)] for name in tensors if name.endswith(suffix)]
    if fp8:  # a weight_scale beside an e4m3 weight
        prefixes = [p for p in prefixes if getattr(tensors.get(p + ".weight"), "dtype", None) == torch.float8_e4m3fn]
    return prefixes


def _reader(scheme: CheckpointScheme) -> Callable[[dict[str, torch.Tensor], torch.dtype], QuantizedWeight]:
    module = READERS.get((scheme.method, scheme.weights))
    if module is None:
        raise ValueError(f"no checkpoint reader for {scheme.describe()}")
    if scheme.weights == "int4":
        return lambda parts, dtype: module.read(parts, dtype, scheme.group_size)
    return module.read


def _cast(name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not t.is_floating_point() or name.endswith(FP32_SUFFIXES):
        return t
    if t.dtype == torch.float8_e4m3fn:
        raise ValueError(f"FP8 tensor {name} has no weight_scale beside it")
    return t.to(dtype)


def load_quantized_checkpoint(model_dir: Path, scheme: CheckpointScheme, dtype: torch.dtype, device: str) -> Loaded:
    """Every tensor of the checkpoint, each quantized linear module as one canonical
    ``<module>.weight`` (dense ``dtype`` tensors instead when ``scheme.dequantize``)."""
    raw = read_safetensors(model_dir)
    out: Loaded = {}
    if scheme.on_the_fly:
        dense = {name: _cast(name, t, dtype) for name, t in raw.items()}
        out = quantize_linear_weights(dense, ON_THE_FLY[scheme.weights])
    else:
        module = READERS.get((scheme.method, scheme.weights))
        read = _reader(scheme)
        prefixes = quantized_modules(raw, module.MARKER, fp8=scheme.weights == "fp8")  # type: ignore[union-attr]
        if not prefixes:
            raise ValueError(f"{model_dir} declares {scheme.describe()} but no module is stored that way")
        for prefix in prefixes:
            parts = {s: raw.pop(f"{prefix}.{s}") for s in module.TENSORS if f"{prefix}.{s}" in raw}  # type: ignore[union-attr]
            try:
                out[f"{prefix}.weight"] = read(parts, dtype)
            except (ValueError, KeyError) as e:
                raise ValueError(f"{prefix}: {e}") from e
        for name, t in raw.items():
            out[name] = _cast(name, t, dtype)
    if scheme.dequantize:
        out = {name: w.dequantize(dtype) if is_quantized(w) else w for name, w in out.items()}
    return {name: w.to(device) for name, w in out.items()}
