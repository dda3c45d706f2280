"""Triton kernels of the CUDA ops (:mod:`..cuda`).

Triton ships with CUDA builds of torch. With ``TRITON_INTERPRET=1`` (set before this package
is imported) the same kernels run on the CPU through Triton's interpreter: slowly, but enough
to check them against the reference ops on small shapes without a GPU.
"""

from .attention import INVARIANT_BLOCK_M, paged_attention
from .cache import write_kv
from .elementwise import add_rms_norm, rms_norm, rotary_, swiglu
from .fp8_matmul import fp8_linear, fp8_variants, quantize_per_token, scaled_mm_takes
from .int4_matmul import int4_linear, int4_variants
from .invariant_matmul import invariant_linear
from .lora import lora_add
from .split_kv import split_kv_decode

__all__ = [
    "INVARIANT_BLOCK_M",
    "add_rms_norm",
    "fp8_linear",
    "fp8_variants",
    "int4_linear",
    "int4_variants",
    "invariant_linear",
    "lora_add",
    "paged_attention",
    "quantize_per_token",
    "rms_norm",
    "rotary_",
    "scaled_mm_takes",
    "split_kv_decode",
    "swiglu",
    "write_kv",
]
