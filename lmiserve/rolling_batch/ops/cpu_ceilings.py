"""What this CPU can do at best, measured in a fraction of a second: how fast it reads memory and
how fast it multiplies matrices in fp32 and in bf16, with every thread torch uses.

- Memory: the sum of a 256 MiB fp32 tensor (more than the caches of the CPUs this runs on, bar a
  few server parts with very large L3 caches, where the figure is the cache's), best of three.
- Arithmetic: a (256, 2048) by (2048, 2048) product through torch (oneDNN), best of three; for
  bf16 that is AMX or AVX512_BF16 where the CPU has them, and oneDNN's widening code elsewhere.

Decode steps are bound by the first (every weight read once a step), prefill by the second;
``lmiserve bench --cpu-report`` sets a model's steps against both, and the engine's CPU defaults
for the prompt share of decode steps follow their ratio.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

READ_BYTES = 256 << 20
GEMM = (256, 2048, 2048)
TRIES = 3


@dataclass(frozen=True)
class Ceilings:
    read_bytes_per_s: float
    flops: dict[str, float]
    """Per dtype name (``fp32``, ``bf16``): multiply-adds counted as two operations."""

    def describe(self) -> str:
        flops = ", ".join(f"{name} {value / 1e9:.0f} GFLOP/s" for name, value in self.flops.items())
        return f"memory reads {self.read_bytes_per_s / 1e9:.1f} GB/s; matrix products {flops}"


def _best(fn, tries: int = TRIES) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up: first touch of the pages, oneDNN's kernel generation
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def read_bandwidth(nbytes: int = READ_BYTES) -> float:
    data = torch.ones(nbytes // 4, dtype=torch.float32)
    return nbytes / _best(lambda: data.sum())


def matmul_flops(dtype: torch.dtype, shape: tuple[int, int, int] = GEMM) -> float:
    m, k, n = shape
    a = torch.full((m, k), 0.5, dtype=dtype)
    b = torch.full((k, n), 0.25, dtype=dtype)
    return 2 * m * k * n / _best(lambda: torch.mm(a, b))


def measure() -> Ceilings:
    return Ceilings(read_bandwidth(), {"fp32": matmul_flops(torch.float32), "bf16": matmul_flops(torch.bfloat16)})
