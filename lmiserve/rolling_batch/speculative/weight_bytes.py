"""What a decode step of a model reads of its weights: the measure a draft's cost is given in.

A step at one sequence is bound by reading the weights, so a draft model's token costs about its
weight bytes over the target's (:attr:`.draft_model.DraftModelProposer.cost_ratio`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..ops.interface import ExpertWeights, LinearWeight


def step_weight_bytes(model: Any) -> int:
    """The weight bytes a decode step of ``model`` (a :class:`..models.decoder.DecoderModel`)
    reads: its layers' weights (dense tensors, or the quantized blocks the kernels read), the final
    norm and the LM head (a tied head: the embedding table); not the embeddings' lookup (a few
    rows). A tensor two fields name is counted once."""
    seen: set[int] = set()
    head = getattr(model, "lm_head", None)
    return _bytes(model.layers, seen) + _bytes(model.norm, seen) + _bytes(head, seen)


def _bytes(obj: Any, seen: set[int]) -> int:
    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        if obj.is_meta or id(obj) in seen:
            return 0
        seen.add(id(obj))
        return obj.nbytes
    if isinstance(obj, LinearWeight):
        # what the kernel reads: the repacked GGUF blocks, the quantized weight, or the dense one
        if obj.packing.startswith("gguf-") and obj.packed is not None:
            main: Any = obj.packed
        else:
            main = obj.quant if obj.quant is not None else obj.weight
        return _bytes(main, seen) + _bytes(obj.bias, seen)
    if isinstance(obj, ExpertWeights):
        return _bytes(obj.w13, seen) + _bytes(obj.w2, seen)
    if isinstance(obj, (list, tuple)):
        return sum(_bytes(x, seen) for x in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj) if f.name != "packed")
    return 0
