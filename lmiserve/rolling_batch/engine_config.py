"""What an engine is built with: the model, the device and the limits of its batches and KV cache.

Plain data (no torch), so the API process can read it without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config.schema import EngineSettings, ModelSettings


@dataclass
class EngineConfig:
    model_dir: Path
    dtype: str = "fp32"
    device: str = "cpu"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_bytes: int | None = None
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    ops: str = "auto"
    tensor_parallel_degree: int = 1
    max_prefill_seqs: int | None = None
    decode_prefill_tokens: int | None = None
    """Most prompt tokens in a step that also decodes (None: the whole budget)."""
    decode_prefill_tokens_per_seq: int | None = None
    """In a step that also decodes, most prompt tokens per sequence running or waiting (None: no such limit)."""
    enforce_eager: bool = False
    """No device graphs: every step runs kernel by kernel."""
    deterministic: bool = False
    """A request's tokens do not depend on the rest of the batch (:mod:`.ops.batch_invariant`)."""
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None


def engine_options(model: ModelSettings, engine: EngineSettings) -> dict[str, str]:
    """The settings the engine process needs, as the strings that cross the process boundary."""
    return {"model": model.model_dump_json(), "engine": engine.model_dump_json()}
