"""Which tiles the bf16 linear kernel runs on a CPU with AVX512_BF16, measured once a process:
``vdpbf16ps`` on bf16 pairs (``csrc/linear.cpp``), or FMAs on the weights widened to fp32 in
registers (``csrc/linear_fma.cpp``), which an AVX512_BF16 build has as well.

Intel documents ``vdpbf16ps`` as two fp32 FMAs a lane, the odd k's product first, with denormal
inputs read as zero, denormal results flushed and rounding to nearest even. The FMA tiles do
that (x's denormals read as zero too), so where the CPU's instruction is what the document says,
the two give the same bits and only their speed differs; the one exception is a weight below
bf16's smallest normal (1.2e-38) or a running sum below fp32's, which the FMA tiles keep and
``vdpbf16ps`` reads or flushes as zero (setting the CPU's own flush mode around each tile cost
more than a quarter of the FMA tiles' speed). It differs a lot: on a 2-core Xeon seen here ``vdpbf16ps``
issued at a quarter of the FMAs' rate (1.35 against 5.5 G instructions a second), and the FMA
tiles multiplied 32 rows and more at 260-280 GFLOP/s against 170; elsewhere (AMD's Zen 4) the
instruction runs at full rate.

So both are timed on one weight at a few row counts (tens of milliseconds), and the FMA tiles are
taken from the smallest count at which they are faster there and at every larger count measured.
Before that, a probe with random values, zeros and denormal x checks that the two give the same
bits on this CPU; where they do not, the FMA tiles are never taken, so that no output depends on
a measurement. Deterministic mode takes them for every row count or for none, so that a row
takes one path whatever the batch. ``LMISERVE_LINEAR_FMA_ROWS`` (0: never) sets
the row count instead of the measurement, still subject to the probe.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field

import torch

from .cpu_ceilings import fastest
from .cpu_kernels import bf16_linear_kernel

log = logging.getLogger("lmiserve.ops")

ENV = "LMISERVE_LINEAR_FMA_ROWS"
ROWS = (1, 4, 8, 32)
"""Row counts timed; the FMA tiles start at one of them or never."""
WEIGHT = (2048, 1024)
"""The timed weight (out, in): 4 MiB of bf16, beyond most CPUs' L2 as a model's weights are."""
MARGIN = 0.95
"""The FMA tiles are taken at a row count only when they take less than this share of the time
of ``vdpbf16ps`` there (ties keep the instruction)."""
REPEATS = 7


@dataclass(frozen=True)
class TileChoice:
    fma_rows: int
    """Rows of x from which products run on the FMA tiles (0: never)."""
    why: str
    ratios: dict[int, float] = field(default_factory=dict)
    """FMA tiles' time over ``vdpbf16ps``'s, per row count measured."""


def _ops():  # type: ignore[no-untyped-def]
    return torch.ops.lmiserve_cpu


def has_both() -> bool:
    """Whether this build has both kinds of tiles (an AVX512_BF16 build of the kernels)."""
    return bf16_linear_kernel() and str(_ops().linear_bf16_isa()) == "avx512_bf16"


def _product(x: torch.Tensor, packed: torch.Tensor, n: int, fma_rows: int) -> torch.Tensor:
    _ops().set_linear_bf16_fma_rows(fma_rows)
    return _ops().linear_bf16(x, packed, None, n)


def same_bits() -> bool:
    """Whether the FMA tiles give the bits of ``vdpbf16ps`` here: 19 rows (two tiles and a partial
    one) of random values, zeros and denormals by 100 columns, over 1,600 inputs (two stretches),
    inputs scaled from 1e-3 to 1e2, so that products span 1e-6 to 1e4 and many sums round."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(19, 1600, generator=g) * torch.logspace(-3, 2, 1600)[torch.randperm(1600, generator=g)]
    w = torch.randn(100, 1600, generator=g) * torch.logspace(-3, 2, 1600)[torch.randperm(1600, generator=g)]
    pick = torch.rand(x.shape, generator=g)
    x[pick < 0.02] = 0.0
    x[pick > 0.98] = torch.randn(int((pick > 0.98).sum()), generator=g) * 1e-39  # below bf16's smallest normal
    w[torch.rand(w.shape, generator=g) < 0.02] = 0.0
    xb, wb = x.bfloat16(), w.bfloat16()
    packed = _ops().pack_linear_bf16(wb)
    before = _ops().linear_bf16_fma_rows()
    try:
        return torch.equal(_product(xb, packed, 100, 0), _product(xb, packed, 100, 1))
    finally:
        _ops().set_linear_bf16_fma_rows(before)


def measure(rows: tuple[int, ...] = ROWS, repeats: int = REPEATS) -> dict[int, float]:
    """Per row count, the FMA tiles' time over ``vdpbf16ps``'s (fastest of ``repeats``, the two
    taking turns), on :data:`WEIGHT`."""
    g = torch.Generator().manual_seed(0)
    n, k = WEIGHT
    packed = _ops().pack_linear_bf16((torch.randn(n, k, generator=g) * 0.02).bfloat16())
    before = _ops().linear_bf16_fma_rows()
    ratios = {}
    try:
        for m in rows:
            x = torch.randn(m, k, generator=g).bfloat16()
            times = {0: float("inf"), 1: float("inf")}
            for _ in range(2):
                for fma in (0, 1):
                    times[fma] = min(times[fma], fastest(lambda f=fma, xs=x: _product(xs, packed, n, f), repeats))
            ratios[m] = times[1] / times[0]
    finally:
        _ops().set_linear_bf16_fma_rows(before)
    return ratios


def fma_rows_from(ratios: dict[int, float], margin: float = MARGIN) -> int:
    """The smallest row count from which the FMA tiles win at every count measured (0: none)."""
    start = 0
    for m in sorted(ratios, reverse=True):
        if ratios[m] >= margin:
            break
        start = m
    return start


def decide(forced: str | None = None, whole: bool = False) -> TileChoice:
    """Where the FMA tiles should run here: from ``forced`` rows (:data:`ENV`'s value) or as
    measured; ``whole`` (deterministic mode): from 1 row or never."""
    if not same_bits():
        return TileChoice(0, "vdpbf16ps only: the FMA tiles do not give its bits on this CPU")
    if forced is not None:
        rows = int(forced) if forced.strip().isdigit() else -1
        if rows < 0:
            raise ValueError(f"{ENV} is 0 (never) or a number of rows, not {forced!r}")
        return TileChoice(min(rows, 1) if whole else rows, f"set by {ENV}")
    ratios = measure()
    rows = fma_rows_from(ratios)
    shown = ", ".join(f"{m} rows {r:.2f}x" for m, r in ratios.items())
    why = f"measured (FMA time / vdpbf16ps time: {shown}); the same bits"
    if whole and rows:
        return TileChoice(1, f"{why}; every row count (deterministic mode)", ratios)
    return TileChoice(rows, why, ratios)


@functools.cache
def _decided(whole: bool) -> TileChoice:
    choice = decide(os.environ.get(ENV), whole)
    where = (
        f"FMAs on widened weights from {choice.fma_rows} rows" if choice.fma_rows else "vdpbf16ps for every row count"
    )
    log.info("bf16 linear tiles: %s, %s", where, choice.why)
    return choice


def choose(whole: bool = False) -> TileChoice | None:
    """Decide once a process and mode, and set it in the kernels (again at every call: the ops
    made last, the engine's, have their mode's); None where the build has only one kind of tiles."""
    if not has_both():
        return None
    choice = _decided(whole)
    _ops().set_linear_bf16_fma_rows(choice.fma_rows)
    return choice


def default_rows() -> int | None:
    """The default mode's FMA row count (None: one kind of tiles in this build): the mode of the
    ops that measure the kernels at start-up, so a part of those measurements' keys."""
    return _decided(False).fma_rows if has_both() else None
