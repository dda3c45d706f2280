"""What lmiserve learns of vLLM: whether it is installed, and what a started engine says of itself
(the ``info`` the server reports: version, device, dtype, lengths and sizes)."""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any

from ..process.client import EngineStartError
from .params import VllmApi

NOT_INSTALLED = "option.rolling_batch=vllm needs the vllm package, which is not installed (pip install vllm)"


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (vLLM's configuration errors span several)."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def engine_info(engine: Any, api: VllmApi, wanted: dict[str, Any]) -> dict[str, str | int | float]:
    inner = getattr(engine, "engine", None)  # vLLM's V0 async engine wraps an LLMEngine
    config = getattr(engine, "vllm_config", None) or getattr(inner, "vllm_config", None)
    model_config = (
        getattr(engine, "model_config", None)
        or getattr(config, "model_config", None)
        or getattr(inner, "model_config", None)
    )
    scheduler = getattr(config, "scheduler_config", None)
    cache = getattr(config, "cache_config", None)
    info: dict[str, str | int | float] = {"backend": "vllm", "vllm_version": api.version}
    dtype = getattr(model_config, "dtype", None) or wanted["dtype"]
    info["dtype"] = str(dtype).removeprefix("torch.")
    with contextlib.suppress(Exception):
        from vllm.platforms import current_platform  # type: ignore[import-not-found]

        info["device"] = str(current_platform.device_type)
    info.setdefault("device", "unknown")
    info["max_model_len"] = int(getattr(model_config, "max_model_len", 0) or wanted.get("max_model_len", 0))
    if info["max_model_len"] <= 0:
        raise EngineStartError("vLLM started but does not say its max_model_len; set option.max_model_len")
    info["max_num_seqs"] = int(getattr(scheduler, "max_num_seqs", 0) or wanted["max_num_seqs"])
    for key, source, name in (
        ("max_num_batched_tokens", scheduler, "max_num_batched_tokens"),
        ("block_size", cache, "block_size"),
        ("kv_blocks", cache, "num_gpu_blocks"),
    ):
        value = getattr(source, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            info[key] = value
    info["tensor_parallel_size"] = int(wanted["tensor_parallel_size"])
    info["pipeline_parallel_size"] = int(wanted.get("pipeline_parallel_size", 1))
    return info
