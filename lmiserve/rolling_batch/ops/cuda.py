"""The device ops on CUDA GPUs: Triton kernels for the paged cache and the element-wise work.

- Attention reads keys and values straight from the paged cache, in two kernels per layer:
  every decode row (a sequence with one query row, seen on the device) takes the split-KV
  kernel (:mod:`.triton_kernels.split_kv`: fixed chunks of keys in parallel, then their fold),
  whatever else is in the step; when the step has prompt rows (``max_q_len > 1``), one launch
  of :mod:`.triton_kernels.attention` attends every sequence of more than one row (prompt
  chunks and prompts that continue a cached prefix) and skips the decodes. So a decode's bits
  do not depend on the batch size or on prompts beside it. Both are sized from host integers
  only (the sequences, the block tables' width in keys, ``max_q_len``), so they can be
  captured in a CUDA graph.
- K/V writes: one launch per layer; slot -1 (padding) stores nothing, without a host check.
- RMSNorm with the residual add, rotary embedding and SwiGLU: one fused launch each, for fp16
  and bf16. fp32 keeps the reference ops, whose rounding matches transformers step for step.
- LoRA: two launches per projection over the step's device index of adapter rows, sized by
  host integers only (:mod:`.triton_kernels.lora`), so they are captured with the rest.
- Linear layers: cuBLAS through ``F.linear`` on the fused QKV and gate/up weights.
- Quantized linear layers (:mod:`.cuda_quant`, one launch per projection, fused ones included;
  the gate/up product is then the SwiGLU kernel's input as for dense weights):

  - 4-bit groups (AWQ, GPTQ, act-order too): :mod:`.triton_kernels.int4_matmul`, dequantized
    in the kernel per tile; decode steps (up to 16 rows) split the inner dimension into a fixed
    number of parts, summed in order by a second launch.
  - FP8 per channel: W8A8 on compute capability 8.9 and up (activations quantized per token by
    a Triton kernel, then ``torch._scaled_mm`` for bf16, else :mod:`.triton_kernels.fp8_matmul`),
    W8A16 below (weights dequantized in the kernel).
  - GGUF blocks: dequantized once to the model's dtype, then as dense weights.
- Deterministic mode (:mod:`.batch_invariant`) uses the same kernels differently: linear layers
  through :mod:`.triton_kernels.invariant_matmul` (quantized ones through their kernels with one
  fixed tiling and no split of the inner dimension), and every row (decodes too) through one launch
  of :mod:`.triton_kernels.attention` with a fixed query tile.

Triton comes with CUDA builds of torch. The same kernels run on the CPU under
``TRITON_INTERPRET=1``, which is how they are tested without a GPU.
"""

from __future__ import annotations

import torch

from . import cuda_quant
from .interface import LinearWeight
from .metadata import PagedAttentionInputs
from .reference import ReferenceOps

_HALF = (torch.float16, torch.bfloat16)


class CudaOps(ReferenceOps):
    name = "cuda"
    native_formats: tuple[str, ...] = ("int4", "fp8")

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        """``dtype``: the model's, where known, to dequantize GGUF blocks to at prepare."""
        from . import triton_kernels

        self.kernels = triton_kernels
        self.dtype = dtype

    def prepare_linear(self, weight, bias=None):  # type: ignore[no-untyped-def]
        if isinstance(weight, torch.Tensor):
            return super().prepare_linear(weight, bias)
        return cuda_quant.prepare(weight, None if bias is None else bias.contiguous(), self.dtype)

    def linear(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        if w.quant is None:
            return super().linear(x, w)
        return cuda_quant.linear(self.kernels, x, w)

    def invariant_linear(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        """:meth:`linear` with each row's bits independent of the other rows (deterministic mode)."""
        return cuda_quant.linear(self.kernels, x, w, invariant=True)

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):  # type: ignore[no-untyped-def]
        self.kernels.write_kv(k, v, k_cache, v_cache, slot_mapping)

    def _step_attention(self, q, k_cache, v_cache, paged: PagedAttentionInputs, scale, window=0, softcap=0.0):  # type: ignore[no-untyped-def]
        tables, cu, lens = paged.block_tables, paged.cu_q_lens, paged.seq_lens
        out = torch.empty_like(q)
        max_context = tables.shape[1] * k_cache.shape[1]
        self.kernels.split_kv_decode(
            q, k_cache, v_cache, tables, cu, lens, scale, window, out, max_context, softcap=softcap
        )
        if paged.max_q_len > 1:
            self.kernels.paged_attention(
                q, k_cache, v_cache, tables, cu, lens, paged.max_q_len, scale, window, out, skip_decodes=True,
                softcap=softcap,
            )  # fmt: skip
        return out

    def lora_add(self, y, x, a, b, lora, parts=None):  # type: ignore[no-untyped-def]
        """Every segment of the step's device index (its runs on the host are not read: a captured
        launch serves every step)."""
        self.kernels.lora_add(y, x, a, b, lora.device_index(), parts)

    def rms_norm(self, x, weight, eps):  # type: ignore[no-untyped-def]
        if x.dtype in _HALF and x.is_contiguous():
            return self.kernels.rms_norm(x, weight, eps)
        return super().rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):  # type: ignore[no-untyped-def]
        if x.dtype in _HALF and x.is_contiguous() and residual.is_contiguous():
            return self.kernels.add_rms_norm(x, residual, weight, eps)
        return super().add_rms_norm(x, residual, weight, eps)

    def rotary(self, q, k, cos, sin, interleaved=False):  # type: ignore[no-untyped-def]
        if (
            not interleaved
            and q.dtype in _HALF
            and cos.dtype == q.dtype
            and cos.is_contiguous()
            and sin.is_contiguous()
        ):
            return self.kernels.rotary_(q, k, cos, sin)
        return super().rotary(q, k, cos, sin, interleaved)

    def swiglu(self, gate_up):  # type: ignore[no-untyped-def]
        if gate_up.dtype in _HALF and gate_up.is_contiguous():
            return self.kernels.swiglu(gate_up)
        return super().swiglu(gate_up)
