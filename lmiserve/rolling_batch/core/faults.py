"""Faults that end one sequence while the engine runs on: memory running out in a step, NaN or
inf logits, a deadline passed in the queue, a step that fails. Each ends the sequence at fault
(with an ``error_kind``, :class:`~lmiserve.wire.SeqDelta`, and counted in the engine's stats but
for a failing step) and the others go on.

Memory running out in a step (``torch.OutOfMemoryError``, or the CPU allocator's "can't allocate
memory") leaves the step undone: the scheduled tokens are not recorded as computed and the blocks
allocated for them are given back, so the sequences are as before the step. The sequence that
asked the most of the step ends (:func:`oom_victim`); the others run again in the next step.
Memory that runs out while the step samples, after some rows have drawn, is not undone for their
generators: a seeded sequence there continues with other draws than it would have had.

A step that fails otherwise is run again in halves until the failing sequences are found
(:func:`retry_in_halves`); only those end. Nothing outside the device changed in the failed run,
so the others' tokens are those they would have had.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ... import wire
from ..runner.parallel import TensorParallelError
from ..scheduling.block_manager import BlockManager
from ..scheduling.scheduler import SchedulerOutput
from ..scheduling.sequence import Sequence
from .outputs import error_delta

log = logging.getLogger("lmiserve.engine")

Finish = Callable[[Sequence, str], None]
"""Ends a sequence with a finish reason (its blocks are free for the next step)."""


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
    return max(batch.decodes + batch.verifies, key=lambda item: item.seq.num_tokens).seq


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


def undo_out_of_memory(
    batch: SchedulerOutput, exc: Exception, blocks: BlockManager, counts: FaultCounts, finish: Finish
) -> list[wire.SeqDelta]:
    """Memory ran out in ``batch``: it is undone, its largest sequence ends, the rest wait for
    the next step."""
    roll_back(batch, blocks)
    release_cached_memory()
    seq = oom_victim(batch)
    log.warning("out of memory in a step of %d sequences; request %s ends", len(batch.scheduled), seq.request_id)
    counts.oom += 1
    finish(seq, "error")
    return [error_delta(seq, f"out of memory in the engine's step: {exc}", "oom")]


def end_nonfinite(seq: Sequence, counts: FaultCounts, finish: Finish) -> wire.SeqDelta:
    """End ``seq``, whose logits held NaN or inf (the others in its step go on)."""
    log.warning("request %s: the model's logits are not finite; the sequence ends", seq.request_id)
    counts.nonfinite += 1
    finish(seq, "error")
    return error_delta(seq, "the model gave NaN or infinite logits for this sequence", "nonfinite")


def retry_in_halves(
    batch: SchedulerOutput,
    exc: Exception,
    run: Callable[[SchedulerOutput], list[wire.SeqDelta]],
    finish: Finish,
) -> list[wire.SeqDelta]:
    """A failed batch again (``run``: run and update a batch), split until the failing sequences
    are found; only those end."""
    items = batch.scheduled
    if len(items) == 1:
        seq = items[0].seq
        log.exception("request %s failed", seq.request_id)
        finish(seq, "error")
        return [error_delta(seq, f"{type(exc).__name__}: {exc}")]
    log.warning("a batch of %d sequences failed (%s); retrying them in halves", len(items), exc)
    deltas: list[wire.SeqDelta] = []
    half = len(items) // 2
    for part in (items[:half], items[half:]):
        live = SchedulerOutput.of([i for i in part if not i.seq.finished])
        if not live:
            continue
        try:
            deltas += run(live)
        except TensorParallelError:
            raise
        except Exception as inner:  # noqa: BLE001
            deltas += retry_in_halves(live, inner, run, finish)
    return deltas
