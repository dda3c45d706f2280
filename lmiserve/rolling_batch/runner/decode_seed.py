"""Decode steps timed at start-up: the first points of the engine's decode curve
(:class:`..core.speeds.StepSpeeds`), so that admission control knows from the first burst how a step
grows with the batch on this model and device, instead of scaling the one small batch the first
requests ran at in proportion.

After the warm-up, steps of padding sequences (KV slot -1: nothing is stored) are timed at one
sequence and at ``min(max_num_seqs, SEED_BATCH)``, each the faster of two runs, on the path a real
step of that size takes (its captured graph where one fits, eager otherwise) and with the LM head
on every row. Their context is one token, so attention costs next to nothing: real steps, as they
run, take the points over (each band's point is smoothed over its steps). Device kernels run by
Triton's interpreter on the host (the test suites' CPU stand-in for a GPU) are not timed: their
times say nothing of a device, and a batch of 32 takes that interpreter seconds. A step that
fails here is logged and leaves the curve to the real steps: admission then scales in proportion
until they have run, and the engine starts all the same.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from .warmup import padding_step

SEED_BATCH = 32
"""The larger batch timed: past the small-batch tiles, cheap on every device."""
RUNS = 2
log = logging.getLogger("lmiserve.engine")


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device.startswith("npu"):
        torch.npu.synchronize()  # type: ignore[attr-defined]  # torch_npu's namespace


def time_decode_steps(runner: Any, max_num_seqs: int) -> tuple[tuple[int, float], ...]:
    """(decoding sequences, seconds) of a decode step at one sequence and at the larger batch;
    none where they are not timed or a step failed."""
    if runner.ops.name == "cuda" and not runner.device.startswith("cuda"):
        return ()
    try:
        return _timed(runner, max_num_seqs)
    except Exception as exc:  # noqa: BLE001 - a figure for admission, never a reason not to start
        log.warning(
            "decode steps not timed at start-up (%s: %s): admission learns from the first steps",
            type(exc).__name__,
            exc,
        )
        return ()


def time_rows(runner: Any, rows: list[int]) -> tuple[tuple[int, float], ...]:
    """(decode rows, seconds) of a step of each of ``rows`` (the costs speculative decoding weighs
    its proposals against); none where they are not timed or a step failed."""
    if runner.ops.name == "cuda" and not runner.device.startswith("cuda"):
        return ()
    try:
        return _timed(runner, 0, rows, runs=3)
    except Exception as exc:  # noqa: BLE001 - a cost model's input, never a reason not to start
        log.warning("decode rows not timed at start-up (%s: %s)", type(exc).__name__, exc)
        return ()


@torch.inference_mode()
def _timed(
    runner: Any, max_num_seqs: int, rows: list[int] | None = None, runs: int = RUNS
) -> tuple[tuple[int, float], ...]:
    timed = []
    for batch in sorted(set(rows) if rows else {1, max(1, min(max_num_seqs, SEED_BATCH))}):
        arrays = padding_step(batch, 1, runner.block_size)
        graphs = runner.graphs
        best = float("inf")
        for _ in range(runs):
            _synchronize(runner.device)
            started = time.perf_counter()
            hidden = graphs.run(arrays) if graphs is not None and graphs.fits(arrays) else runner.run_eager(arrays)
            if runner.model.lm_head is not None:
                runner.model.logits(hidden[:batch])
            _synchronize(runner.device)
            best = min(best, time.perf_counter() - started)
        timed.append((batch, best))
    return tuple(timed)
