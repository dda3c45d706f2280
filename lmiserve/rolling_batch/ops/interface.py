"""The ops interface: every device implementation and every wrapper around one provides these.

Shapes and meanings are defined by the plain-torch implementation (:mod:`.reference`), which
the others must match; :mod:`.contract` checks the inputs that touch the paged cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from ..quant.weights import QuantizedWeight
    from .metadata import LoraStep, PagedAttentionInputs

T = torch.Tensor


@dataclass
class LinearWeight:
    """A weight prepared for :meth:`Ops.linear` (backends may pack it)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    packed: torch.Tensor | None = None
    packing: str = ""
    """Whose layout ``packed`` is in (a backend's name for it); "" when nothing is packed."""
    quant: QuantizedWeight | None = None
    """The weight as it is stored quantized (:mod:`..quant.weights`); ``weight`` is then a tensor
    on the meta device that only gives the shape."""
    dense: LinearWeight | None = None
    """The same weight dequantized and prepared again, which a backend may run instead from some
    number of rows on (a CPU's GGUF blocks: :attr:`.cpu.CpuOps.dense_rows`); None: none kept."""

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]


@dataclass
class ExpertWeights:
    """A mixture-of-experts layer's experts, prepared for :meth:`Ops.fused_moe` (backends may pack them)."""

    w13: torch.Tensor
    """``(experts, 2 * intermediate, hidden)``: each expert's gate rows, then its up rows."""
    w2: torch.Tensor
    """``(experts, hidden, intermediate)``: each expert's down projection."""
    packed: tuple[torch.Tensor, ...] = ()
    packing: str = ""

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]


ROW_INVARIANT_PACKINGS = (
    "lmiserve",
    "lmiserve-gated",
    *(f"gguf-{kind}{x}" for kind in ("q4_0", "q4_1", "q8_0") for x in ("", "+int8")),
)
"""Packings whose product forms each row's sums in the same order whatever the other rows (the
CPU's ``csrc/linear.cpp`` for bf16 rows, ``csrc/quant_linear.cpp`` and, with int8 activations,
``csrc/quant_linear_int8.cpp`` for any), so deterministic mode runs them whole rather than in
fixed blocks."""


@runtime_checkable
class Ops(Protocol):
    """The device ops (shapes as :mod:`.reference` documents them). ``T`` is a tensor."""

    name: str
    native_formats: tuple[str, ...]
    """The quantized layouts (``gguf``, ``int4``, ``fp8``) these ops multiply as they are; the
    loader dequantizes the others."""

    # linear layers
    def prepare_linear(self, weight: T | QuantizedWeight, bias: T | None = None) -> LinearWeight: ...
    def linear(self, x: T, w: LinearWeight) -> T: ...
    def prepare_gate_up(self, weight: T | QuantizedWeight) -> LinearWeight: ...
    def gate_up_swiglu(self, x: T, w: LinearWeight) -> T: ...
    # normalisation, activation, rotary
    def rms_norm(self, x: T, weight: T, eps: float) -> tuple[T, T]: ...
    def add_rms_norm(self, x: T, residual: T, weight: T, eps: float) -> tuple[T, T]: ...
    def swiglu(self, gate_up: T) -> T: ...
    def geglu(self, gate_up: T) -> T: ...
    def rotary(self, q: T, k: T, cos: T, sin: T, interleaved: bool = False) -> tuple[T, T]: ...
    # the paged KV cache: queries rotated out with keys and values stored, stores, attention
    def rotate_and_store(self, qkv: T, heads: int, cos: T, sin: T, k_cache: T, v_cache: T, slot_mapping: T) -> T: ...
    def write_kv(self, k: T, v: T, k_cache: T, v_cache: T, slot_mapping: T) -> None: ...
    def attention(
        self,
        q: T,
        k_cache: T,
        v_cache: T,
        paged: PagedAttentionInputs,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
    ) -> T: ...
    # mixture of experts (the routing, which differs by family, is the model's)
    def prepare_experts(self, w13: T, w2: T) -> ExpertWeights: ...
    def fused_moe(self, x: T, topk_weights: T, topk_ids: T, experts: ExpertWeights) -> T: ...
    # adapters
    def lora_add(self, y: T, x: T, a: T, b: T, lora: LoraStep, parts: tuple[int, ...] | None = None) -> None: ...
    # sampling
    def argmax_logsumexp(self, logits: T) -> tuple[T, T]: ...
    def top_k_top_p(self, logits: T, top_k: T | None, top_p: T | None) -> T: ...


class OpsWrapper(Ops):
    """An :class:`Ops` in front of another: every op is the inner one's unless a subclass
    overrides it. The ops a subclass leaves alone are the inner ones themselves, bound here,
    so they cost nothing more than calling the inner ops directly."""

    def __init__(self, inner: Ops):
        self.inner = inner
        self.name = inner.name
        for op in OP_NAMES:
            if getattr(type(self), op) is getattr(Ops, op):
                setattr(self, op, getattr(inner, op))

    @property
    def kernels(self) -> bool:
        """Whether the innermost ops run compiled kernels (the CPU ops may fall back)."""
        return bool(getattr(self.inner, "kernels", False))

    @property
    def native_formats(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.native_formats


OP_NAMES = tuple(name for name in vars(Ops) if not name.startswith("_") and callable(getattr(Ops, name)))
"""Every op of the interface."""
