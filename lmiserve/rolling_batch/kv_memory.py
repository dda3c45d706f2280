"""Memory for the KV cache: how many blocks fit in a configured size, an accelerator's free
memory, or a share of the host's free memory (the default on the CPU, for our engine and for
vLLM on a CPU). torch is imported only to ask an accelerator."""

from __future__ import annotations

from pathlib import Path

from .engine_config import EngineConfig

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


def kv_cache_blocks(cfg: EngineConfig, max_model_len: int, block_bytes: int, device: str, workspace: int = 0) -> int:
    """KV blocks of ``block_bytes`` (one process's share of a block) that fit on ``device``.

    ``kv_cache_bytes`` and an accelerator's memory are per process (per device); the CPU default
    budget is the host's, shared by the tensor-parallel ranks. ``workspace``: bytes an
    accelerator keeps free beside the activations (the attention kernels' scratch).
    """
    if cfg.kv_cache_bytes:
        return max(1, cfg.kv_cache_bytes // block_bytes)
    wanted = cfg.max_num_seqs * max_model_len
    wanted_blocks = -(-wanted // cfg.block_size)
    if device.startswith(("cuda", "npu")):
        free, total = device_memory(device)
        reserve = int(total * (1 - cfg.gpu_memory_utilization)) + 512 * 1024**2 + workspace  # activations
        budget = max(0, free - reserve)
    else:
        budget = cpu_kv_cache_bytes() // cfg.tensor_parallel_degree
    floor = -(-max_model_len // cfg.block_size)
    return max(floor, min(wanted_blocks, budget // block_bytes))


def device_memory(device: str) -> tuple[int, int]:
    """Free and total bytes of an accelerator (``torch.npu`` exists once torch_npu is imported)."""
    import torch

    if device.startswith("npu"):
        import torch_npu  # noqa: F401 - registers torch.npu

        return torch.npu.mem_get_info(torch.device(device))  # type: ignore[attr-defined]
    return torch.cuda.mem_get_info(torch.device(device))
