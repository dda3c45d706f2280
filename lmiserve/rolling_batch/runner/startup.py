"""Starting an engine: the model's weights, the other tensor-parallel ranks, the adapters' slots,
the KV cache in the memory left, the step graphs, the warm-up of every kernel a request can
reach, and the line that says what runs."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...devices import torch_dtype
from ...generation.eos_tokens import eos_token_ids
from ..engine_config import EngineConfig
from ..kv_memory import GIB, kv_cache_blocks
from ..lora.engine_adapters import EngineAdapters
from ..models.architectures import spec_from_config
from ..models.spec import ModelSpec, read_config
from . import graphs
from .decode_seed import time_decode_steps
from .guided import GuidedDecoder
from .mixed_graphs import MAX_PROMPT_TOKENS
from .model_runner import ModelRunner
from .parallel import WorkerRanks, agree_min, check_devices
from .phase_log import PhaseLog
from .sampler import Sampler
from .sharding import Shard, check_shardable
from .warmup import warm_up

log = logging.getLogger("lmiserve.engine")


@dataclass
class Loaded:
    """What an engine runs on, once started."""

    spec: ModelSpec
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    runner: ModelRunner
    lora: EngineAdapters
    guided: GuidedDecoder
    sampler: Sampler
    num_blocks: int
    block_bytes: int
    ranks: WorkerRanks | None
    decode_seed: tuple[tuple[int, float], ...] = ()
    """Decode steps timed at start-up, (sequences, seconds): the engine's first decode curve."""
    speculation: Any = None
    """Speculative decoding (``core.speculation.Speculation``), when configured."""

    def close(self) -> None:
        if self.ranks is not None:
            self.ranks.close()


def start(config: EngineConfig, on_rank_failure: Callable[[str], None] | None = None) -> Loaded:
    """Load everything the engine needs; the other ranks are stopped again if anything fails."""
    spec = spec_from_config(read_config(config.model_dir))
    max_model_len = config.max_model_len or spec.max_position_embeddings
    ranks = None
    tp = config.tensor_parallel_degree
    if tp > 1:
        check_shardable(spec, tp)
        check_devices(config.device, tp)
        for_ranks = dataclasses.asdict(dataclasses.replace(config, max_model_len=max_model_len))
        ranks = WorkerRanks(for_ranks, tp, config.device, on_rank_failure)
    try:
        return _load(config, spec, max_model_len, ranks)
    except BaseException:
        if ranks is not None:
            ranks.close()
        raise


def _load(config: EngineConfig, spec: ModelSpec, max_model_len: int, ranks: WorkerRanks | None) -> Loaded:
    """This process's weights and KV cache. With tensor parallelism the other ranks load their
    shards meanwhile; the cache gets the number of blocks that fits on every rank."""
    dtype, tp = torch_dtype(config.dtype), config.tensor_parallel_degree
    runner = ModelRunner(
        config.model_dir,
        spec,
        dtype,
        config.device,
        max_model_len,
        config.block_size,
        config.ops,
        shard=Shard(0, tp) if tp > 1 else None,
        deterministic=config.deterministic,
        quantize=config.quantize,
        int8_activations=config.quantize_activations == "int8",
        gguf_dense_rows=config.gguf_dense_rows,
    )
    phases = PhaseLog(log, "engine start")
    lora = EngineAdapters(config, spec, runner.model, dtype)
    block_bytes = runner.block_bytes
    workspace = _attention_workspace(config, runner, max_model_len)
    num_blocks = kv_cache_blocks(config, max_model_len, block_bytes, config.device, workspace)
    if ranks is not None:
        ranks.join()
        num_blocks = agree_min(num_blocks, config.device)
    if num_blocks * config.block_size < max_model_len:
        raise ValueError(
            f"the KV cache holds {num_blocks * config.block_size} tokens, fewer than max_model_len "
            f"({max_model_len}); raise option.kv_cache_memory or lower option.max_model_len"
        )
    runner.allocate_cache(num_blocks)
    phases.done("KV cache allocated")
    if ranks is not None:
        runner.channel = ranks.ready()
    else:
        backend = None if config.enforce_eager else graphs.backend_for(config.device)
        if backend is not None and spec.num_experts and runner.ops.name != "cpu":
            # the fused MoE op has no device kernel yet: its reference routes tokens on the host
            log.warning(
                "%s: mixture-of-experts layers run step by step on %s (no graphs)", spec.architecture, config.device
            )
            backend = None
        if backend is not None:
            runner.capture_graphs(decode_rows(config), backend, _decode_step_prompt_tokens(config))
        if backend is not None or runner.ops.name == "cuda":
            runner.warm_keys |= warm_up(runner, lora=lora.book is not None)
        phases.done("graphs and warm-up")
    eos = eos_token_ids(config.model_dir, spec.eos_token_ids)
    guided = GuidedDecoder(config.model_dir, spec.vocab_size, eos)
    runner.sampler = sampler = Sampler(config.device, runner.ops, guided)
    phases.done("sampler")
    runner.eos_token_ids = eos
    seed = time_decode_steps(runner, config.max_num_seqs) if ranks is None else ()
    phases.done("decode steps timed")
    return Loaded(spec, max_model_len, eos, runner, lora, guided, sampler, num_blocks, block_bytes, ranks, seed)


def _attention_workspace(config: EngineConfig, runner: ModelRunner, max_model_len: int) -> int:
    """Bytes of the CUDA split-KV decode kernel's scratch at the largest batch a step or a
    captured graph runs (its launch covers the block tables' whole width); 0 elsewhere."""
    if runner.ops.name != "cuda":
        return 0
    from ..ops.triton_kernels.split_kv import scratch_bytes

    keys = max(max_model_len, MAX_PROMPT_TOKENS + 1) + config.block_size  # mixed graphs' padding run
    return scratch_bytes(config.max_num_seqs + 1, keys, runner.spec.num_heads, runner.spec.head_dim)


MAX_VERIFY_ROWS = 256
"""Most decode rows the captured graphs cover when sequences propose tokens (beyond: eager steps)."""


def decode_rows(config: EngineConfig) -> int:
    """Most decode rows a step runs: one per sequence, and with speculative decoding a verify run's
    rows too (each proposed token is attended as a decode), so verify steps replay the decode
    graphs, bucketed by sequences times proposals."""
    spec = config.speculative
    if spec is None:
        return config.max_num_seqs
    rows = config.max_num_seqs * (1 + spec.num_speculative_tokens)
    return min(rows, max(config.max_num_seqs, MAX_VERIFY_ROWS))


def _decode_step_prompt_tokens(config: EngineConfig) -> int:
    """The most prompt tokens a step that decodes takes (the scheduler's limit)."""
    budget = max(config.max_num_batched_tokens, config.max_num_seqs)
    return config.max_decode_step_prefill_tokens or budget


def describe(config: EngineConfig, loaded: Loaded, step_tokens: int, started: float) -> dict[str, Any]:
    """What runs, for ``GET /models`` and the start-up log line (which this writes)."""
    spec, runner, cfg = loaded.spec, loaded.runner, config
    capacity = loaded.num_blocks * cfg.block_size
    info: dict[str, Any] = {
        "architecture": spec.architecture,
        "dtype": cfg.dtype,
        "quantization": runner.quantization,
        "device": cfg.device,
        "ops": runner.ops.name,
        "max_model_len": loaded.max_model_len,
        "block_size": cfg.block_size,
        "kv_blocks": loaded.num_blocks,
        "kv_tokens": capacity,
        "kv_bytes": loaded.num_blocks * loaded.block_bytes,
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": step_tokens,
        "decode_prefill_tokens": cfg.max_decode_step_prefill_tokens or step_tokens,
        "decode_prefill_tokens_per_seq": cfg.decode_step_prefill_tokens_per_sequence or "off",
        "tensor_parallel_degree": cfg.tensor_parallel_degree,
        "deterministic": "on" if cfg.deterministic else "off",
        "decode_graphs": ",".join(map(str, runner.graphs.buckets)) if runner.graphs else "off",
        "mixed_graphs": _mixed(runner),
        "decode_step_ms": ", ".join(f"{b}: {t * 1e3:.1f}" for b, t in loaded.decode_seed) or "not timed",
        **loaded.lora.info(),
    }
    if loaded.ranks is not None:
        info["rank_pids"] = loaded.ranks.pids
    log.info(
        "engine ready in %.1f s: %s, %s, weights %s, on %s (%s ops); KV cache %d blocks x %d = %d tokens (%.2f GiB), "
        "%.1f sequences of max_model_len %d",
        time.monotonic() - started,
        spec.architecture,
        cfg.dtype,
        runner.quantization,
        cfg.device,
        runner.ops.name,
        loaded.num_blocks,
        cfg.block_size,
        capacity,
        info["kv_bytes"] / GIB,
        capacity / loaded.max_model_len,
        loaded.max_model_len,
    )
    if loaded.ranks is not None:
        log.info(
            "tensor parallel degree %d: each rank holds %d of %d query heads and %d of %d KV heads; "
            "the KV cache above is per rank",
            cfg.tensor_parallel_degree,
            runner.spec.num_heads,
            spec.num_heads,
            runner.spec.num_kv_heads,
            spec.num_kv_heads,
        )
    return info


def _mixed(runner: ModelRunner) -> str:
    """``sequences x prompt tokens`` of the mixed-step graphs, or ``off``."""
    mixed = runner.mixed_graphs
    if mixed is None:
        return "off"
    return f"{','.join(map(str, mixed.seq_buckets))} x {','.join(map(str, mixed.token_buckets))}"
