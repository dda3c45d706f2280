"""A step's model inputs, built once per step from the scheduler's output.

Each scheduled sequence is read once for its fields (start, token count, the token ids it
runs, its block table); positions, KV slots, the padded block-table matrix and the lengths
are then worked out for the whole step at once with numpy, never token by token, and reach
the device in two copies (one int64 array, one int32 array), each part of which starts 16-byte
aligned.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from ..ops.generated_rows import generated_rows
from ..ops.metadata import AttentionMetadata, LoraIndex, LoraStep, PagedAttentionInputs
from ..scheduling.scheduler import SchedulerOutput
from ..scheduling.sequence import Sequence


@dataclass
class TokenFill:
    """Input ids not yet on the host: token ``positions[i]`` of the step is ``source[rows[i]]``, a
    token the step before sampled on the device (all three tensors are on the device)."""

    positions: torch.Tensor
    source: torch.Tensor
    rows: torch.Tensor

    def apply(self, input_ids: torch.Tensor) -> None:
        input_ids.index_copy_(0, self.positions, self.source.index_select(0, self.rows))


@dataclass
class StepArrays:
    """The step on the host. Decodes come first (a decode is a run of one token; each row of a verify
    run is one), then prompt chunks."""

    input_ids: np.ndarray
    """int64 ``(T,)``."""
    positions: np.ndarray
    """int64 ``(T,)``."""
    slots: np.ndarray
    """int64 ``(T,)``: where each token's key and value go in the paged cache."""
    block_tables: np.ndarray
    """int32 ``(S, W)``: each sequence's blocks, padded with block 0."""
    cu_q_lens: np.ndarray
    """int32 ``(S + 1,)``: where each sequence's tokens start, and the end."""
    seq_lens: np.ndarray
    """int32 ``(S,)``: each sequence's length once this step has run."""
    num_decodes: int
    lora_slots: np.ndarray | None = None
    """int32 ``(S,)``: the device slot of each sequence's adapter, -1 for none; None when no
    sequence of the step uses an adapter."""
    prompt_lens: np.ndarray | None = None
    """int32 ``(S,)``: each sequence's prompt length, when a prompt chunk of the step holds tokens
    generated before (a replay, a recompute), which are attended as decodes
    (:mod:`..ops.generated_rows`); None when none does."""
    fill: TokenFill | None = None
    """Input ids that come from the previous step's samples on the device (their host value is a
    placeholder), set by the overlapped engine."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def max_q_len(self) -> int:
        return int(np.diff(self.cu_q_lens).max(initial=0))


def _exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _entries(out: SchedulerOutput) -> list[tuple[Sequence, int, list[int]]]:
    """``(sequence, first position, token ids)`` of each run the attention sees: the decodes, each row
    of a verify run as the decode of its position (its last token, then each proposed token, each
    attending the rows before it, whose keys and values the step writes first), the prompt chunks."""
    found = [(i.seq, i.start, i.seq.token_ids[i.start : i.start + 1]) for i in out.decodes]
    for item in out.verifies:
        seq, start = item.seq, item.start
        found += [(seq, start + j, [t]) for j, t in enumerate((seq.token_ids[start], *item.draft))]
    found += [(i.seq, i.start, i.seq.token_ids[i.start : i.start + i.num_tokens]) for i in out.prefills]
    return found


def build_step_arrays(out: SchedulerOutput, block_size: int, mark_generated: bool = True) -> StepArrays:
    """The step's arrays. ``mark_generated``: set :attr:`StepArrays.prompt_lens` where a prompt
    chunk holds generated tokens (not in deterministic mode, whose ops attend every prompt row as
    a decode already)."""
    entries = _entries(out)
    n = len(entries)
    starts = np.fromiter((start for _, start, _ in entries), np.int64, n)
    counts = np.fromiter((len(ids) for _, _, ids in entries), np.int64, n)
    tables = [seq.block_table for seq, _, _ in entries]
    widths = np.fromiter(map(len, tables), np.int64, n)
    cu = _exclusive_cumsum(counts)
    total = int(cu[-1])
    ids = np.fromiter(chain.from_iterable(ids for _, _, ids in entries), np.int64, total)
    # the block-table matrix, filled in one scatter
    table_cu = _exclusive_cumsum(widths)
    flat = np.fromiter(chain.from_iterable(tables), np.int32, int(table_cu[-1]))
    matrix = np.zeros((n, int(widths.max(initial=0))), dtype=np.int32)
    table_rows = np.repeat(np.arange(n), widths)
    matrix[table_rows, np.arange(flat.shape[0]) - table_cu[table_rows]] = flat
    # per token: its sequence, position and slot
    owner = np.repeat(np.arange(n), counts)
    positions = starts[owner] + (np.arange(total) - cu[owner])
    slots = matrix[owner, positions // block_size].astype(np.int64) * block_size + positions % block_size
    prompt_lens = None
    if mark_generated and any(i.start + i.num_tokens > i.seq.num_prompt_tokens for i in out.prefills):
        prompt_lens = np.fromiter((seq.num_prompt_tokens for seq, _, _ in entries), np.int32, n)
    adapters = [seq.group.adapter for seq, _, _ in entries]
    lora_slots = None
    if any(a is not None for a in adapters):
        lora_slots = np.fromiter((-1 if a is None else a.slot for a in adapters), np.int32, n)
    return StepArrays(
        input_ids=ids,
        positions=positions,
        slots=slots,
        block_tables=matrix,
        cu_q_lens=cu.astype(np.int32),
        seq_lens=(starts + counts).astype(np.int32),
        num_decodes=len(out.decodes) + sum(i.num_tokens for i in out.verifies),
        lora_slots=lora_slots,
        prompt_lens=prompt_lens,
    )


def lora_runs(arrays: StepArrays) -> list[tuple[int, int, int]]:
    """``(slot, first row, end row)`` for each run of consecutive sequences with one adapter."""
    runs: list[tuple[int, int, int]] = []
    if arrays.lora_slots is None:
        return runs
    cu = arrays.cu_q_lens.tolist()
    for s, slot in enumerate(arrays.lora_slots.tolist()):
        if slot < 0:
            continue
        if runs and runs[-1][0] == slot and runs[-1][2] == cu[s]:
            runs[-1] = (slot, runs[-1][1], cu[s + 1])
        else:
            runs.append((slot, cu[s], cu[s + 1]))
    return runs


def lora_segments(arrays: StepArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """int32 ``(slots, firsts, ends, rows)``: one segment per slot used in the step (by slot),
    covering ``rows[first:end]``, the slot's token rows in step order."""
    slots = arrays.lora_slots
    if slots is None:
        empty = np.zeros(0, dtype=np.int32)
        return empty, empty, empty, empty
    per_token = np.repeat(slots, np.diff(arrays.cu_q_lens))
    adapted = np.flatnonzero(per_token >= 0)
    order = np.argsort(per_token[adapted], kind="stable")
    rows = adapted[order].astype(np.int32)
    used, counts = np.unique(per_token[rows], return_counts=True)
    ends = np.cumsum(counts).astype(np.int32)
    return used.astype(np.int32), ends - counts.astype(np.int32), ends, rows


def _aligned(parts: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """The parts end to end, each starting 16 bytes after a multiple of 16 from the first (the
    alignment Triton specialises its pointer arguments on, so the same in every step); the
    offset of each part."""
    per = 16 // parts[0].itemsize
    offsets, at = [], 0
    for part in parts:
        offsets.append(at)
        at += -(-part.shape[0] // per) * per
    packed = np.zeros(at, dtype=parts[0].dtype)
    for part, offset in zip(parts, offsets):
        packed[offset : offset + part.shape[0]] = part
    return packed, offsets


def step_tensors(
    arrays: StepArrays, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Input ids, positions and attention metadata on ``device``, in two copies."""
    t, s, w = arrays.num_tokens, arrays.num_seqs, arrays.block_tables.shape[1]
    packed, (_, at_pos, at_slots) = _aligned([arrays.input_ids, arrays.positions, arrays.slots])
    longs = _to_device(packed, device)
    index = lora_segments(arrays) if arrays.lora_slots is not None else ()
    parts = [arrays.block_tables.ravel(), arrays.cu_q_lens, arrays.seq_lens, *index]
    packed, (_, at_cu, at_lens, *at_index) = _aligned(parts)
    ints = _to_device(packed, device)
    paged = PagedAttentionInputs(
        block_tables=ints[: s * w].view(s, w),
        cu_q_lens=ints[at_cu : at_cu + s + 1],
        seq_lens=ints[at_lens : at_lens + s],
        max_q_len=arrays.max_q_len,
        host_cu_q_lens=arrays.cu_q_lens.tolist(),
        host_seq_lens=arrays.seq_lens.tolist(),
        num_decodes=arrays.num_decodes,
    )
    if arrays.prompt_lens is not None:
        paged.generated = generated_rows(
            arrays.positions, arrays.block_tables, arrays.cu_q_lens, arrays.num_decodes, arrays.prompt_lens, device
        )
    if arrays.fill is not None:
        arrays.fill.apply(longs[:t])
    runs = lora_runs(arrays)
    lora = None
    if runs:  # the device index came in the same copy (its segments: the step's slots)
        views = [ints[at : at + part.shape[0]] for at, part in zip(at_index, index)]
        ends = index[2]
        max_rows = int((ends - index[1]).max())
        lora = LoraStep(runs, device, LoraIndex(*views, max_rows=max_rows))
    return longs[:t], longs[at_pos : at_pos + t], AttentionMetadata(longs[at_slots : at_slots + t], paged, lora)


def device_tensor(values: list, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """Host values on ``device`` through pinned memory, without waiting for the device: a plain
    copy would wait for all the work queued before it, and the overlapped engine launches a step
    while the one before still runs."""
    tensor = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def _to_device(array: np.ndarray, device: str | torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    if torch.device(device).type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
