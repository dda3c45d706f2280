"""Ranks 1..N-1 of a tensor-parallel engine: load a shard, then run each step rank 0 sends.

Started by rank 0 (:class:`~.parallel.WorkerRanks`) as
``python -m lmiserve.rolling_batch.runner.tp_worker --rank R --world-size N --port P --parent PID
--config JSON``. A rank loads its shard of the weights, tells rank 0 through the TCP store
that it is ready, joins the process group, agrees with the others on the number of KV blocks,
and then runs the forward pass of every step it receives until rank 0 stops it. It dies with
rank 0; an error ends it, which rank 0 sees and treats as fatal.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ... import logs
from ...child import become_child
from ...devices import torch_dtype
from ..engine_config import EngineConfig
from ..kv_memory import kv_cache_blocks
from ..models.architectures import spec_from_config
from ..models.spec import read_config
from .model_runner import ModelRunner
from .parallel import TIMEOUT, StepChannel, agree_min, join_group, rank_device, rank_threads
from .sharding import Shard

log = logging.getLogger("lmiserve.engine")


def serve(runner: ModelRunner, channel: StepChannel) -> int:
    """Run steps until rank 0 stops; the number of steps run."""
    steps = 0
    with torch.inference_mode():
        while (step := channel.recv()) is not None:
            input_ids, positions, meta, copies = step
            if copies is not None:
                runner.copy_block_tensors(*copies)
            runner.model.forward(input_ids, positions, meta, runner.kv_caches)
            steps += 1
    return steps


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lmiserve.rolling_batch.runner.tp_worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    become_child()
    if os.getppid() != args.parent:  # rank 0 is already gone
        return 1
    logs.configure(args.log_level, f"tensor-parallel rank {args.rank} pid {os.getpid()}")
    raw = json.loads(args.config)
    config = EngineConfig(**{**raw, "model_dir": Path(raw["model_dir"])})
    shard = Shard(args.rank, args.world_size)
    device = rank_device(config.device, args.rank)
    if device == "cpu":
        torch.set_num_threads(rank_threads(args.world_size))
    store = dist.TCPStore("127.0.0.1", args.port, args.world_size, is_master=False, timeout=TIMEOUT)
    try:
        spec = spec_from_config(read_config(config.model_dir))
        max_model_len = config.max_model_len or spec.max_position_embeddings
        runner = ModelRunner(
            config.model_dir,
            spec,
            torch_dtype(config.dtype),
            device,
            max_model_len,
            config.block_size,
            config.ops,
            shard=shard,
            deterministic=config.deterministic,
            quantize=config.quantize,
            gguf_dense_rows=config.gguf_dense_rows,
        )
        store.set(f"loaded/{args.rank}", "1")
        join_group(store, args.rank, args.world_size, device)
        blocks = kv_cache_blocks(config, max_model_len, runner.block_bytes, device)
        runner.allocate_cache(agree_min(blocks, device))
        log.info(
            "rank %d of %d on %s ready: %d query heads, %d KV heads, %d KV blocks",
            args.rank,
            args.world_size,
            device,
            runner.spec.num_heads,
            runner.spec.num_kv_heads,
            runner.k_cache.shape[1],
        )
        steps = serve(runner, StepChannel(device))
    except BaseException:  # noqa: BLE001 - rank 0 sees this rank exit and stops the engine
        log.exception("tensor-parallel rank %d failed", args.rank)
        return 1
    log.debug("rank %d stopped after %d steps", args.rank, steps)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
