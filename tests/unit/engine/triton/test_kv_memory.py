"""How many KV blocks fit: an accelerator leaves its activations and the attention scratch free."""

import dataclasses

from lmiserve.rolling_batch import kv_memory
from lmiserve.rolling_batch.engine_config import EngineConfig
from lmiserve.rolling_batch.ops.triton_kernels.split_kv import CHUNK, scratch_bytes

MIB = 1024**2


def config(**changes) -> EngineConfig:
    fields = {f.name: f.default for f in dataclasses.fields(EngineConfig) if f.default is not dataclasses.MISSING}
    return dataclasses.replace(EngineConfig(**{**fields, "model_dir": "."}), **changes)


def test_the_scratch_of_the_largest_launch_is_left_free(monkeypatch):
    monkeypatch.setattr(kv_memory, "device_memory", lambda device: (10_000 * MIB, 10_000 * MIB))
    cfg = config(max_num_seqs=1_000_000, gpu_memory_utilization=0.9, block_size=16)
    without = kv_memory.kv_cache_blocks(cfg, 4096, MIB, "cuda:0")
    assert without == 10_000 - 1_000 - 512  # free, less what is not ours, less the activations
    assert kv_memory.kv_cache_blocks(cfg, 4096, MIB, "cuda:0", workspace=300 * MIB) == without - 300


def test_scratch_bytes_cover_every_chunk_of_every_head():
    # 257 sequences of up to 8192 keys: 32 chunks each, 32 heads of 128 values plus max and sum
    assert scratch_bytes(257, 8192, 32, 128) == 4 * 257 * (8192 // CHUNK) * 32 * 130
    assert scratch_bytes(1, 1, 1, 1) == 4 * 3
