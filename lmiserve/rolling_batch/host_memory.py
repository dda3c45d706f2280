"""The host's free memory, and the share of it a KV cache on the CPU takes by default."""

from __future__ import annotations

from pathlib import Path

GIB = 1024**3
CPU_KV_DEFAULT_BYTES = 2 * GIB


def available_memory() -> int:
    """``MemAvailable`` from /proc/meminfo (8 GiB where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * GIB


def cpu_kv_cache_bytes() -> int:
    """A KV cache on the CPU: 2 GiB, or a quarter of the free memory where that is less."""
    return min(CPU_KV_DEFAULT_BYTES, available_memory() // 4)
