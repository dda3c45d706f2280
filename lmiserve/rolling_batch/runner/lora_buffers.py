"""A step's adapter rows for the device kernels: worked out on the host with numpy, copied to the
device without waiting for it.

:func:`.step_inputs.lora_segments` lists the step's adapted token rows slot by slot (a
stable sort, so each slot's rows keep their order) with one segment ``(slot, first, end)`` per
slot. An eager step sends them with its other integers (:mod:`.step_inputs`). Captured
graphs read fixed buffers instead (:class:`LoraBuffers`): ``max_loras`` segments, one per device
slot at most, so no step has more; the unused ones are empty. Rows without an adapter, and a
bucket's padding rows, are in no segment: no segment is spent on them.
"""

from __future__ import annotations

import numpy as np
import torch

from ..ops.metadata import LORA_MAX_SPLIT_K, LoraIndex
from .step_inputs import StepArrays, lora_runs, lora_segments


def _quads(n: int) -> int:
    return -(-n // 4) * 4


def _pinned(array: np.ndarray) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.pin_memory() if torch.cuda.is_available() else tensor


class LoraBuffers:
    """The segments and rows captured graphs read, and their workspace: allocated once, filled by
    each step before it runs (one non-blocking copy from pinned memory, stream-ordered after the
    step before). Laid out ``slots | firsts | ends | rows``, each part 16-byte aligned."""

    def __init__(self, capacity: int, rows: int, rank_width: int, device: str | torch.device):
        """``capacity`` segments (``max_loras``), ``rows`` token rows (the largest bucket's),
        and ``rank_width`` columns of the widest shrink (``parts * max_lora_rank``)."""
        self.capacity = capacity
        self.rows = rows
        self._stride = _quads(capacity)
        self.ints = torch.zeros(3 * self._stride + _quads(rows), dtype=torch.int32, device=device)
        self.workspace = torch.empty(rows * LORA_MAX_SPLIT_K * rank_width, dtype=torch.float32, device=device)
        self._dirty = True
        self.fills = 0
        """Copies made (a step without adapters after one without makes none)."""

    def index(self, rows: int) -> LoraIndex:
        """The view a graph of ``rows`` token rows reads (its launches are sized by ``rows``)."""
        c, s = self.capacity, self._stride
        ints = self.ints
        return LoraIndex(
            ints[:c], ints[s : s + c], ints[2 * s : 2 * s + c], ints[3 * s : 3 * s + self.rows], rows, self.workspace
        )

    def fill(self, arrays: StepArrays | None) -> list[tuple[int, int, int]]:
        """Copy the step's segments into the buffers (all empty for a step without adapters, or
        ``None``); the step's runs in row order, for ops that read them on the host."""
        if arrays is None or arrays.lora_slots is None:
            if self._dirty:  # only the segment bounds: empty segments read no rows
                self.ints[: 3 * self._stride].copy_(_pinned(np.zeros(3 * self._stride, np.int32)), non_blocking=True)
                self.fills += 1
                self._dirty = False
            return []
        slots, firsts, ends, rows = lora_segments(arrays)
        if slots.shape[0] > self.capacity or rows.shape[0] > self.rows:
            raise ValueError(f"{slots.shape[0]} adapter slots over {rows.shape[0]} rows do not fit the LoRA buffers")
        s = self._stride
        packed = np.zeros(3 * s + rows.shape[0], dtype=np.int32)
        for i, part in enumerate((slots, firsts, ends)):
            packed[i * s : i * s + part.shape[0]] = part
        packed[3 * s :] = rows
        self.ints[: packed.shape[0]].copy_(_pinned(packed), non_blocking=True)
        self.fills += 1
        self._dirty = True
        return lora_runs(arrays)
