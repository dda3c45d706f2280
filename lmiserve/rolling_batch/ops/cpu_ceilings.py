"""What this CPU can do at best, measured in a fraction of a second: how fast it reads memory and
how fast it multiplies matrices in fp32 and in bf16, with every thread torch uses.

- Memory: the sum of an fp32 tensor of 256 MiB, or of twice the last-level cache where that is
  more (a cache that holds part of the tensor adds its own speed to memory's), best of three.
- Arithmetic: a (256, 2048) by (2048, 2048) product through torch (oneDNN), best of three; for
  bf16 that is AMX or AVX512_BF16 where the CPU has them, and oneDNN's widening code elsewhere.

Decode steps are bound by the first (every weight read once a step), prefill by the second;
``lmiserve bench --cpu-report`` sets a model's steps against both, and the engine's CPU defaults
for the prompt share of decode steps follow their ratio.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import torch

READ_BYTES = 256 << 20
GEMM = (256, 2048, 2048)
TRIES = 3


CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


def cache_size_bytes(text: str) -> int:
    """A cache's size as Linux writes it (``491520K``, ``32M``, ``1024``); 0 when unreadable."""
    text = text.strip().upper()
    units = {"K": 10, "M": 20, "G": 30}
    try:
        return int(text[:-1]) << units[text[-1]] if text[-1:] in units else int(text)
    except ValueError:
        return 0


def last_level_cache_bytes(caches: Path = CPU_CACHES) -> int:
    """The largest CPU cache Linux reports (0 where it reports none)."""
    sizes = []
    for entry in caches.glob("index*/size"):
        with contextlib.suppress(OSError):
            sizes.append(cache_size_bytes(entry.read_text()))
    return max(sizes, default=0)


@dataclass(frozen=True)
class Ceilings:
    read_bytes_per_s: float
    flops: dict[str, float]
    """Per dtype name (``fp32``, ``bf16``): multiply-adds counted as two operations."""

    def describe(self) -> str:
        flops = ", ".join(f"{name} {value / 1e9:.0f} GFLOP/s" for name, value in self.flops.items())
        return f"memory reads {self.read_bytes_per_s / 1e9:.1f} GB/s; matrix products {flops}"


def fastest(fn, tries: int = TRIES) -> float:  # type: ignore[no-untyped-def]
    """The fastest of ``tries`` calls of ``fn``, in seconds, after one call to warm up."""
    fn()  # warm-up: first touch of the pages, oneDNN's kernel generation
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def read_bandwidth(nbytes: int = READ_BYTES) -> float:
    data = torch.ones(nbytes // 4, dtype=torch.float32)
    return nbytes / fastest(lambda: data.sum())


def matmul_flops(dtype: torch.dtype, shape: tuple[int, int, int] = GEMM) -> float:
    m, k, n = shape
    a = torch.full((m, k), 0.5, dtype=dtype)
    b = torch.full((k, n), 0.25, dtype=dtype)
    return 2 * m * k * n / fastest(lambda: torch.mm(a, b))


def measure() -> Ceilings:
    return Ceilings(
        read_bandwidth(max(READ_BYTES, 2 * last_level_cache_bytes())),
        {"fp32": matmul_flops(torch.float32), "bf16": matmul_flops(torch.bfloat16)},
    )
