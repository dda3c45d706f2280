"""AsyncEngineArgs: the engine settings the fake understands (a subset of vLLM's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AsyncEngineArgs:
    model: str = ""
    tokenizer: str | None = None
    dtype: str = "auto"
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    block_size: int | None = None
    seed: int | None = 0
    enable_log_requests: bool = False
