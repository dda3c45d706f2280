"""Triton kernels of the CUDA ops (:mod:`..cuda`).

Triton ships with CUDA builds of torch. With ``TRITON_INTERPRET=1`` (set before this package
is imported) the same kernels run on the CPU through Triton's interpreter: slowly, but enough
to check them against the reference ops on small shapes without a GPU.
"""

from .attention import INVARIANT_BLOCK_M, paged_attention
from .cache import write_kv
from .elementwise import add_rms_norm, rms_norm, rotary_, swiglu
from .invariant_matmul import invariant_linear
from .lora import lora_add
from .split_kv import split_kv_decode

__all__ = [
    "INVARIANT_BLOCK_M",
    "add_rms_norm",
    "invariant_linear",
    "lora_add",
    "paged_attention",
    "rms_norm",
    "rotary_",
    "split_kv_decode",
    "swiglu",
    "write_kv",
]
