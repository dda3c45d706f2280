"""Faults that end one sequence while the engine runs on: memory running out in a step, NaN or
inf logits, a deadline passed in the queue. Each ends the sequence at fault with an ``error_kind``
(:class:`~lmiserve.wire.SeqDelta`) and is counted in the engine's stats.

Memory running out in a step (``torch.OutOfMemoryError``, or the CPU allocator's "can't allocate
memory") leaves the step undone: the scheduled tokens are not recorded as computed and the blocks
allocated for them are given back, so the sequences are as before the step. The sequence that
asked the most of the step ends (:func:`oom_victim`); the others run again in the next step.
Memory that runs out while the step samples, after some rows have drawn, is not undone for their
generators: a seeded sequence there continues with other draws than it would have had.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..scheduling.block_manager import BlockManager
from ..scheduling.scheduler import SchedulerOutput
from ..scheduling.sequence import Sequence


@dataclass
class FaultCounts:
    """Sequences ended by each kind of fault (cumulative)."""

    expired: int = 0
    oom: int = 0
    nonfinite: int = 0


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says that device or host memory ran out."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    if isinstance(exc, RuntimeError):
        message = str(exc).lower()
        return "out of memory" in message or "can't allocate memory" in message
    return False


def oom_victim(batch: SchedulerOutput) -> Sequence:
    """The sequence that asked the most of a step: the largest prompt chunk, or in a step of
    decodes only the sequence with the most tokens (the longest attention)."""
    if batch.prefills:
        return max(batch.prefills, key=lambda item: item.num_tokens).seq
    return max(batch.decodes, key=lambda item: item.seq.num_tokens).seq


def roll_back(batch: SchedulerOutput, blocks: BlockManager) -> None:
    """The step's sequences as before it: the blocks allocated for its tokens given back (the
    tokens were never recorded as computed)."""
    for item in batch.scheduled:
        if not item.seq.finished:
            blocks.trim(item.seq)


def release_cached_memory() -> None:
    """Hand the device's cached free memory back after it ran out (nothing to do on the CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
