"""From how many rows a GGUF model served from its blocks in bf16 runs its linear layers from
dense bf16 weights kept beside the blocks (:attr:`.cpu.CpuOps.dense_rows`).

A decode step of a few streams reads every weight once and does little arithmetic with it: the
blocks, a quarter of bf16's bytes or less, win it. A prompt chunk or a full batch does many rows'
arithmetic with each weight: turning blocks into weights then costs more than reading bf16 ones
(on AMX tiles the blocks are dequantized anew, 64 values of k at a time, for every product). Where the crossing
lies depends on the CPU (its memory, its caches, its instructions) and the model's shapes, so it
is measured at start-up, like the dtype of a CPU without bf16 arithmetic (:mod:`.cpu_dtype`, whose
layer shapes and timing this shares): the model's linear layers, from the blocks and dense, at 1 to
256 rows (a prompt's chunk is hundreds: on a Xeon with AMX the blocks kept up with dense weights
to 64 rows), over as many decoder layers as twice the CPU's last-level cache holds in bf16 (at
least 64 MiB, at most the whole model), so that the weights come from memory as in a step. (A
sample that the cache holds times dense weights at its speed: on a Xeon whose 480 MiB L3 kept 64
MiB of them, dense weights measured twice as fast as the step then ran them.) Dense weights are
kept from the fewest rows at which they are faster at that and every larger count measured; where
the blocks win everywhere none are kept, and where dense weights win at one row too the blocks are
not kept either (the weights are dequantized at load).
Dense weights are a candidate only where they take under :data:`.cpu_dtype.DENSE_MEMORY_SHARE` of
the memory available. Measured once per model shape and machine, then read from a cache.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .cpu_ceilings import last_level_cache_bytes
from .cpu_dtype import (
    DENSE_MEMORY_SHARE,
    SAMPLE_BYTES,
    Layer,
    cache_file,
    load_measurement,
    memory_available,
    model_layers,
    sample_layers,
    save_measurement,
    time_alternating,
)

log = logging.getLogger("lmiserve.engine")

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""The row counts measured."""
MARGIN = 0.95
"""Dense weights are taken at a row count only where they take less than this share of the
blocks' time (ties keep the blocks: no second copy)."""


@dataclass(frozen=True)
class RowsChoice:
    dense_rows: int
    """Rows from which the dense weights run (0: never, none kept; 1: always, no blocks kept)."""
    blocks_ms: dict[int, float]
    dense_ms: dict[int, float]
    """Per row count, the model's linear layers (one forward) from the blocks and dense, ms."""

    def why(self) -> str:
        ratios = ", ".join(f"{r} rows {self.dense_ms[r] / self.blocks_ms[r]:.2f}x" for r in sorted(self.blocks_ms))
        if self.dense_rows == 0:
            what = "the blocks at every row count"
        elif self.dense_rows == 1:
            what = "dense bf16 at every row count (the blocks dequantized at load)"
        else:
            what = (
                f"the blocks below {self.dense_rows} rows, dense bf16 weights kept beside them from {self.dense_rows}"
            )
        return f"GGUF blocks or dense bf16, measured (dense time / blocks time: {ratios}): {what}"


def crossing(blocks: dict[int, float], dense: dict[int, float]) -> int:
    """The fewest rows from which dense weights are faster (by :data:`MARGIN`) at every larger
    count measured too; 0 when there are none."""
    rows = 0
    for r in sorted(blocks, reverse=True):
        if dense[r] >= MARGIN * blocks[r]:
            break
        rows = r
    return rows


def sample_bytes() -> int:
    """How many bytes of dense weights the measurement runs through: twice the last-level cache,
    at least :data:`.cpu_dtype.SAMPLE_BYTES`."""
    return max(SAMPLE_BYTES, 2 * last_level_cache_bytes())


def measure_rows(layers: list[Layer], count: int, ops, sample: int = SAMPLE_BYTES) -> RowsChoice:  # type: ignore[no-untyped-def]
    """Time the layers from their blocks and dense at each of :data:`ROWS` (``ops``: a
    :class:`~.cpu.CpuOps` without dense weights of its own) over ``sample`` bytes of dense
    weights' worth of them, scaled to ``count`` decoder layers; the two take turns."""
    sample = sample_layers(layers, count, as_dense=True, sample_bytes=sample)
    scale = count / (len(sample) / len(layers)) * 1e3
    timed = time_alternating(ops, [sample, [x.dense() for x in sample]], torch.bfloat16, ROWS)
    blocks, dense = ({r: t * scale for r, t in times.items()} for times in timed)
    return RowsChoice(crossing(blocks, dense), blocks, dense)


def _dense_bf16_bytes(layers: list[Layer], count: int) -> int:
    return 2 * sum(x.out_features * x.in_features for x in layers) * count


def dense_rows(model_dir: Path, int8_activations: bool = False) -> tuple[RowsChoice | None, str]:
    """The :class:`RowsChoice` for a GGUF model served from its blocks in bf16 on this CPU (against
    int8 activations where ``int8_activations``), and why; None (and why not) where the model has
    no block layers, the CPU's kernels do not run them, or dense weights would take too much memory."""
    from ...model_store import GGUF_SOURCE
    from .cpu import CpuOps

    if not (Path(model_dir) / GGUF_SOURCE).exists():
        return None, ""
    try:
        layers, count, _ = model_layers(model_dir)
    except (OSError, KeyError, ValueError) as exc:
        return None, f"GGUF blocks at every row count (the model's shapes were not read: {exc})"
    layers = [x for x in layers if x.kind != "dense"]
    if not layers:
        return None, ""
    ops = CpuOps(int8_activations=int8_activations)  # builds the kernels where needed: not measured
    if not (ops.kernels and ops.own_linear):
        return None, "GGUF blocks at every row count (no bf16 linear kernel for dense weights on this CPU)"
    available = memory_available()
    if _dense_bf16_bytes(layers, count) >= DENSE_MEMORY_SHARE * available:
        return (
            None,
            f"GGUF blocks at every row count (dense weights would not fit {DENSE_MEMORY_SHARE:.0%} of the free memory)",
        )
    sample = sample_bytes()
    cached = cache_file(layers, count, None, True, ["gguf-rows", ROWS, MARGIN, sample, int8_activations])
    saved = load_measurement(cached)
    try:
        choice = RowsChoice(
            saved["dense_rows"],
            {int(r): t for r, t in saved["blocks_ms"].items()},
            {int(r): t for r, t in saved["dense_ms"].items()},
        )
        return choice, f"{choice.why()} (measured at an earlier start, {cached})"
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    start = time.perf_counter()
    choice = measure_rows(layers, count, ops, sample)
    log.info("GGUF blocks against dense weights measured in %.2f s", time.perf_counter() - start)
    save_measurement(
        cached, {"dense_rows": choice.dense_rows, "blocks_ms": choice.blocks_ms, "dense_ms": choice.dense_ms}
    )
    return choice, choice.why()
