"""From the server's validated settings to the engine's configuration (in the engine process)."""

from __future__ import annotations

import logging
from pathlib import Path

from ..config.schema import EngineSettings, ModelSettings
from ..devices import resolve_device, resolve_dtype
from .engine_config import EngineConfig
from .parallel import resolve_degree

log = logging.getLogger("lmiserve.engine")

CPU_STEP_TOKENS = 2048
"""A step's token budget on CPUs: vLLM's for its CPU server; prompts arriving together are
prefilled in one step when no stream is decoding."""
CPU_DECODE_PREFILL_TOKENS = 512
"""On CPUs, most prompt tokens in a step that also decodes (reached from about 85 sequences on,
under the per-sequence limit below)."""
CPU_DECODE_PREFILL_TOKENS_PER_SEQ = 4
"""On CPUs, prompt tokens a step that also decodes takes per sequence running or waiting. A prompt
token costs about a quarter of a millisecond of a small model's step on two cores (its share of
the matrix products alone), so eight streams wait about 10 ms longer for their next token while
a 32-token chunk runs beside them, and 32 streams get 128-token chunks, which prefill the prompts
arriving among them in a step or two."""
ACCELERATOR_STEP_TOKENS = 4096
NPU_BLOCK_SIZE = 128
"""The NPU attention kernels read the paged cache in blocks of 128 tokens (a multiple of 16 at least)."""
BLOCK_SIZE = 16


def engine_config(model_path: str, options: dict[str, str]) -> EngineConfig:
    model = ModelSettings.model_validate_json(options["model"])
    engine = EngineSettings.model_validate_json(options["engine"])
    device = engine_device(model.rolling_batch, model.device)
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
        block_size=engine.block_size or (NPU_BLOCK_SIZE if device.startswith("npu") else BLOCK_SIZE),
        kv_cache_bytes=engine.kv_cache_memory,
        enable_prefix_caching=engine.enable_prefix_caching,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        tensor_parallel_degree=resolve_degree(model.tensor_parallel_degree, device),
        max_prefill_seqs=engine.max_prefill_batch_size,
        decode_prefill_tokens=engine.max_decode_step_prefill_tokens
        or (CPU_DECODE_PREFILL_TOKENS if device == "cpu" else None),
        decode_prefill_tokens_per_seq=engine.decode_step_prefill_tokens_per_sequence
        or (CPU_DECODE_PREFILL_TOKENS_PER_SEQ if device == "cpu" else None),
        enforce_eager=engine.enforce_eager,
        deterministic=engine.deterministic,
        enable_lora=engine.enable_lora,
        max_loras=engine.max_loras,
        max_lora_rank=engine.max_lora_rank,
        max_cpu_loras=engine.cpu_loras,
    )


def engine_device(backend: str, spec: str) -> str:
    """The engine's device: ``option.rolling_batch=npu`` means an NPU, whatever ``auto`` finds."""
    if backend != "npu":
        return resolve_device(spec)
    if spec == "auto":
        spec = "npu"
    if not spec.startswith("npu"):
        raise ValueError(f"option.rolling_batch=npu runs on an NPU, but option.device is {spec}; use npu or npu:N")
    return resolve_device(spec)
