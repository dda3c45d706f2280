"""Writing a step's keys and values into the paged cache, one program per token."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, ROW: tl.constexpr, ROW_PAD: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot < 0:  # a token whose key and value are not kept
        return
    cols = tl.arange(0, ROW_PAD)
    ok = cols < ROW
    k = tl.load(k_ptr + token * ROW + cols, mask=ok)
    v = tl.load(v_ptr + token * ROW + cols, mask=ok)
    tl.store(k_cache_ptr + slot * ROW + cols, k.to(k_cache_ptr.dtype.element_ty), mask=ok)
    tl.store(v_cache_ptr + slot * ROW + cols, v.to(v_cache_ptr.dtype.element_ty), mask=ok)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Token ``t``'s key and value ``(KVH, D)`` go to slot ``slot_mapping[t]`` (-1: not stored)."""
    tokens = k.shape[0]
    if tokens == 0:
        return
    row = k.shape[1] * k.shape[2]
    _write_kv_kernel[(tokens,)](k, v, k_cache, v_cache, slot_mapping, ROW=row, ROW_PAD=triton.next_power_of_2(row))
