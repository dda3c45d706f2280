"""What every ops implementation may rely on, checked in front of it.

The fused NPU kernels assume things their meta (shape-only) versions never check: an int32
block table with a row per sequence and enough columns for its longest sequence, a block size
that is a multiple of 16 (of 128 on an NPU), a head size of at most 256, query heads that are
a whole multiple (at most 64) of the KV heads, contiguous inputs, cumulative lengths that
never decrease. Broken assumptions there give wrong numbers, not errors, so they are checked
here for every backend: once per model (:func:`check_model`) and on every call of the ops that
touch the paged cache (:class:`CheckedOps`). A step's metadata is checked once per step, not
once per layer: the checks remember the tensors they have already passed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .interface import Ops, OpsWrapper
from .metadata import PagedAttentionInputs


class ContractError(ValueError):
    """Inputs that an ops implementation must not be given."""


@dataclass(frozen=True)
class Limits:
    block_multiple: int = 16
    max_head_dim: int = 256
    max_group: int = 64


DEFAULT_LIMITS = Limits()
NPU_LIMITS = Limits(block_multiple=128)


def limits_for(device: str) -> Limits:
    return NPU_LIMITS if device.startswith("npu") else DEFAULT_LIMITS


def check_model(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, limits: Limits) -> None:
    """The model's shape and the cache's block size against the kernels' limits."""
    if block_size <= 0 or block_size % limits.block_multiple:
        raise ContractError(f"block size {block_size} must be a multiple of {limits.block_multiple} on this device")
    if not 0 < head_dim <= limits.max_head_dim:
        raise ContractError(f"head_dim {head_dim} is above the kernels' limit of {limits.max_head_dim}")
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ContractError(f"{num_heads} attention heads are not a whole multiple of {num_kv_heads} KV heads")
    if num_heads // num_kv_heads > limits.max_group:
        raise ContractError(
            f"{num_heads // num_kv_heads} query heads per KV head is above the kernels' limit of {limits.max_group}"
        )


def _contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ContractError(f"{name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})")


def _cache(k_cache: torch.Tensor, v_cache: torch.Tensor, limits: Limits) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ContractError(
            "the K and V caches must both be (num_blocks, block_size, kv_heads, head_dim), "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.shape[1] % limits.block_multiple:
        raise ContractError(f"block size {k_cache.shape[1]} must be a multiple of {limits.block_multiple}")
    _contiguous("k_cache", k_cache)
    _contiguous("v_cache", v_cache)


def check_block_table(block_table: torch.Tensor, seq_lens: list[int], block_size: int) -> None:
    if block_table.dtype != torch.int32:
        raise ContractError(f"the block table must be int32, not {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != len(seq_lens):
        raise ContractError(
            f"the block table must have one row per sequence ({len(seq_lens)}), got shape {tuple(block_table.shape)}"
        )
    needed = max((-(-n // block_size) for n in seq_lens), default=0)
    if block_table.shape[1] < needed:
        raise ContractError(
            f"the block table has {block_table.shape[1]} columns; the longest sequence needs {needed} blocks"
        )
    _contiguous("block_table", block_table)


def check_seq_lens(seq_lens: list[int]) -> None:
    if any(n <= 0 for n in seq_lens):
        raise ContractError(f"sequence lengths must be positive: {seq_lens}")


def check_cumulative(cu_q_lens: list[int], seq_lens: list[int], tokens: int) -> None:
    """``cu_q_lens``: 0, then each sequence's end; monotonic, ending at the query rows, each
    chunk no longer than its sequence."""
    if len(cu_q_lens) != len(seq_lens) + 1 or cu_q_lens[0] != 0:
        raise ContractError(f"cumulative lengths must start at 0 with one end per sequence: {cu_q_lens}")
    if any(b < a for a, b in zip(cu_q_lens, cu_q_lens[1:])):
        raise ContractError(f"cumulative lengths must not decrease: {cu_q_lens}")
    if cu_q_lens[-1] != tokens:
        raise ContractError(f"cumulative lengths end at {cu_q_lens[-1]}, but there are {tokens} query rows")
    for s, (a, b) in enumerate(zip(cu_q_lens, cu_q_lens[1:])):
        if b - a > seq_lens[s]:
            raise ContractError(f"sequence {s} has {b - a} query tokens but only {seq_lens[s]} tokens in all")


class CheckedOps(OpsWrapper):
    """An ops implementation behind the contract. Ops that do not touch the paged cache are
    the implementation's own (no overhead); the others check their inputs first."""

    def __init__(self, ops: Ops, limits: Limits = DEFAULT_LIMITS):
        super().__init__(ops)
        self.limits = limits
        self._checked: dict[str, tuple[torch.Tensor, ...]] = {}

    def _seen(self, kind: str, *tensors: torch.Tensor) -> bool:
        """True when these very tensors passed last time (every layer of a step gets the same
        ones). Holding them keeps their identity from being reused by a later step."""
        last = self._checked.get(kind)
        return last is not None and len(last) == len(tensors) and all(a is b for a, b in zip(last, tensors))

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):  # type: ignore[no-untyped-def]
        _cache(k_cache, v_cache, self.limits)
        for name, t in (("key", k), ("value", v)):
            _contiguous(name, t)
            if t.dim() != 3 or t.shape[1:] != k_cache.shape[2:]:
                raise ContractError(f"{name} must be (tokens, kv_heads, head_dim) like the cache, got {tuple(t.shape)}")
        if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0] or slot_mapping.is_floating_point():
            raise ContractError("the slot mapping must hold one integer slot per token")
        return self.inner.write_kv(k, v, k_cache, v_cache, slot_mapping)

    def rotate_and_store(self, qkv, heads, cos, sin, k_cache, v_cache, slot_mapping):  # type: ignore[no-untyped-def]
        _cache(k_cache, v_cache, self.limits)
        _contiguous("qkv", qkv)
        width = (heads + 2 * k_cache.shape[2]) * k_cache.shape[3]
        if qkv.dim() != 2 or qkv.shape[1] != width:
            raise ContractError(
                f"qkv must be (tokens, {width}): heads + 2 kv_heads of head_dim, got {tuple(qkv.shape)}"
            )
        if slot_mapping.dim() != 1 or slot_mapping.shape[0] != qkv.shape[0] or slot_mapping.is_floating_point():
            raise ContractError("the slot mapping must hold one integer slot per token")
        return self.inner.rotate_and_store(qkv, heads, cos, sin, k_cache, v_cache, slot_mapping)

    def _attention_inputs(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        _cache(k_cache, v_cache, self.limits)
        _contiguous("query", q)
        if q.dim() != 3 or q.shape[2] != k_cache.shape[3]:
            raise ContractError(f"the query must be (tokens, heads, head_dim), got {tuple(q.shape)}")
        check_model(q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], self.limits)

    def lora_add(self, y, x, a, b, lora, parts=None):  # type: ignore[no-untyped-def]
        """Shapes that agree; runs in order, inside the step's rows, each naming a slot of the pool
        (checked once per step: every layer gets the same runs)."""
        rows, slots = y.shape[0], a.shape[0]
        if x.shape[0] != rows or a.shape[2] != x.shape[1] or b.shape[2] != y.shape[1] or b.shape[1] != a.shape[1]:
            raise ContractError(
                f"LoRA shapes disagree: y {tuple(y.shape)}, x {tuple(x.shape)}, A {tuple(a.shape)}, B {tuple(b.shape)}"
            )
        if lora.checked != (rows, slots):
            last = 0
            for slot, first, end in lora.segments:
                if not (0 <= slot < slots and last <= first < end <= rows):
                    raise ContractError(
                        f"LoRA run {(slot, first, end)} is out of order or outside {rows} rows, {slots} slots"
                    )
                last = end
            lora.checked = (rows, slots)
        return self.inner.lora_add(y, x, a, b, lora, parts)

    def attention(self, q, k_cache, v_cache, paged, scale, window=0, softcap=0.0):  # type: ignore[no-untyped-def]
        """The whole step at once; checked on the host copies of its lengths (no device read,
        so the check may run while a device graph is being captured)."""
        self._attention_inputs(q, k_cache, v_cache)
        self._paged("paged", paged, q.shape[0], k_cache.shape[1])
        generated = paged.generated
        if generated is not None:  # attended again as decodes, each row on its own
            self._paged("generated", generated.paged, generated.rows.shape[0], k_cache.shape[1])
        return self.inner.attention(q, k_cache, v_cache, paged, scale, window, softcap)

    def _paged(self, kind: str, paged: PagedAttentionInputs, rows: int, block_size: int) -> None:
        """The step's attention inputs for ``rows`` query rows, checked once per step."""
        if self._seen(kind, paged.block_tables):
            return
        lens = paged.host_seq_lens
        check_seq_lens(lens)
        check_cumulative(paged.host_cu_q_lens, lens, rows)
        check_block_table(paged.block_tables, lens, block_size)
        if paged.seq_lens.shape[0] != len(lens) or paged.cu_q_lens.shape[0] != len(lens) + 1:
            raise ContractError("the lengths on the device and on the host disagree in size")
        if paged.max_q_len < max((b - a for a, b in zip(paged.host_cu_q_lens, paged.host_cu_q_lens[1:])), default=0):
            raise ContractError(f"max_q_len {paged.max_q_len} is below the longest run of query rows")
        nd, cu = paged.num_decodes, paged.host_cu_q_lens
        if not 0 <= nd <= len(lens) or any(cu[i + 1] - cu[i] != 1 for i in range(nd)):
            raise ContractError(f"the first {nd} sequences must be decodes of one query row each")
        self._checked[kind] = (paged.block_tables,)
