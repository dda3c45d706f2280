"""From the server's validated settings to the engine's configuration (in the engine process)."""

from __future__ import annotations

import logging
from pathlib import Path

from ..config.schema import EngineSettings, ModelSettings
from ..devices import resolve_device, resolve_dtype
from .engine import EngineConfig
from .parallel import resolve_degree

log = logging.getLogger("lmiserve.engine")

CPU_STEP_TOKENS = 512
ACCELERATOR_STEP_TOKENS = 4096


def engine_options(model: ModelSettings, engine: EngineSettings) -> dict[str, str]:
    """The settings the engine process needs, as the strings that cross the process boundary."""
    return {"model": model.model_dump_json(), "engine": engine.model_dump_json()}


def engine_config(model_path: str, options: dict[str, str]) -> EngineConfig:
    model = ModelSettings.model_validate_json(options["model"])
    engine = EngineSettings.model_validate_json(options["engine"])
    device = resolve_device(model.device)
    dtype, why = resolve_dtype(model.dtype, device)
    log.info("dtype %s (%s)", dtype, why)
    step_tokens = engine.max_rolling_batch_prefill_tokens or (
        CPU_STEP_TOKENS if device == "cpu" else ACCELERATOR_STEP_TOKENS
    )
    return EngineConfig(
        model_dir=Path(model_path),
        dtype=dtype,
        device=device,
        max_num_seqs=engine.max_rolling_batch_size,
        max_num_batched_tokens=step_tokens,
        max_model_len=model.max_model_len,
        block_size=engine.block_size,
        kv_cache_bytes=engine.kv_cache_memory,
        enable_prefix_caching=engine.enable_prefix_caching,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        tensor_parallel_degree=resolve_degree(model.tensor_parallel_degree, device),
    )
