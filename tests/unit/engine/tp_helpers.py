"""Tensor parallelism without processes: every rank's shard of a model run on its own thread,
their all-reduces summed in memory, so a sharded forward pass can be compared with the whole
model's in one process."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.registry import decoder_class
from lmiserve.rolling_batch.models.rope import rope_tables
from lmiserve.rolling_batch.models.spec import ModelSpec, read_config
from lmiserve.rolling_batch.ops import select_ops
from lmiserve.rolling_batch.ops.metadata import AttentionMetadata, PagedAttentionInputs
from lmiserve.rolling_batch.quant.safetensors_weights import load_state_dict
from lmiserve.rolling_batch.runner.sharding import Shard, local_spec, shard_pieces, shard_state_dict

BLOCK = 16
NUM_BLOCKS = 8


def build(out: Path, arch: str, seed: int = 3, **overrides) -> Path:
    """A tiny random model whose biases are random too (transformers starts them at zero,
    which would hide a bias loaded wrongly or added once per rank)."""
    import safetensors.torch

    from tests.tiny_models import build_model

    build_model(out, arch, seed=seed, **overrides)
    path = out / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    g = torch.Generator().manual_seed(seed)
    for name, t in tensors.items():
        if name.endswith(".bias"):
            tensors[name] = torch.randn(t.shape, generator=g) * 0.5
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})
    return out


class ThreadGroup:
    """``all_reduce`` for ranks on threads of one process: each rank's tensor becomes the sum."""

    def __init__(self, world: int):
        self.barrier = threading.Barrier(world, timeout=120)
        self.parts: list[torch.Tensor | None] = [None] * world

    def all_reduce(self, rank: int):  # type: ignore[no-untyped-def]
        def reduce(t: torch.Tensor) -> None:
            self.parts[rank] = t.clone()
            self.barrier.wait()
            total = sum(self.parts[1:], self.parts[0])  # type: ignore[arg-type]
            self.barrier.wait()  # nobody overwrites a part before everyone has summed
            t.copy_(total)

        return reduce


Step = tuple[torch.Tensor, torch.Tensor, AttentionMetadata]


def step(decodes: list[tuple[list[int], int, int]], prefills: list[tuple[list[int], list[int], int]]) -> Step:
    """One step's inputs: ``decodes`` are (block table, position, token), ``prefills`` are
    (block table, tokens, first position) of a prompt chunk continuing what is cached."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []

    def add(table: list[int], pos: int, token: int) -> None:
        ids.append(token)
        positions.append(pos)
        slots.append(table[pos // BLOCK] * BLOCK + pos % BLOCK)

    for table, pos, token in decodes:
        add(table, pos, token)
    cu = list(range(len(decodes) + 1))
    for table, tokens, start in prefills:
        for i, token in enumerate(tokens):
            add(table, start + i, token)
        cu.append(cu[-1] + len(tokens))
    width = NUM_BLOCKS
    tables = [t + [0] * (width - len(t)) for t, _, _ in decodes + prefills]
    lens = [pos + 1 for _, pos, _ in decodes] + [start + len(tokens) for _, tokens, start in prefills]
    paged = PagedAttentionInputs.of(
        torch.tensor(tables, dtype=torch.int32),
        torch.tensor(cu, dtype=torch.int32),
        torch.tensor(lens, dtype=torch.int32),
        num_decodes=len(decodes),
    )
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots), paged=paged)
    return torch.tensor(ids), torch.tensor(positions), meta


def batch_steps(vocab: int, seed: int = 0) -> tuple[list[Step], list[int]]:
    """Three steps over three sequences (prefills, decodes beside a prefill, a chunked prompt)
    and the 20 prompt tokens of the first sequence."""
    g = torch.Generator().manual_seed(seed)
    a, b, c = (torch.randint(4, vocab, (n,), generator=g).tolist() for n in (22, 7, 12))
    ta, tb, tc = [0, 1], [2], [3]
    steps = [
        step([], [(ta, a[:20], 0), (tb, b[:6], 0)]),
        step([(ta, 20, a[20]), (tb, 6, b[6])], [(tc, c[:5], 0)]),
        step([(ta, 21, a[21])], [(tc, c[5:], 5)]),
    ]
    return steps, a[:20]


def spec_of(model_dir: Path) -> ModelSpec:
    return spec_from_config(read_config(model_dir))


def sharded_logits(
    model_dir: Path, world: int, ops: str, steps: list[Step], dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """Rank 0's logits for every token of every step, with the model split over ``world``
    ranks (``world`` 1: the whole model, no all-reduce)."""
    spec = spec_of(model_dir)
    tensors = load_state_dict(model_dir, dtype)
    cos, sin = rope_tables(model_dir, spec.architecture, 256)
    group = ThreadGroup(world)

    def run_rank(rank: int) -> list[torch.Tensor]:
        if world == 1:
            model = decoder_class(spec)(spec, tensors, select_ops("cpu", ops), cos, sin)
            local = spec
        else:
            shard = Shard(rank, world)
            local = local_spec(spec, shard)
            weights = shard_state_dict(tensors, shard_pieces(spec, shard, lm_head=rank == 0))
            model = decoder_class(spec)(
                local, weights, select_ops("cpu", ops), cos, sin, all_reduce=group.all_reduce(rank), lm_head=rank == 0
            )
        shape = (NUM_BLOCKS, BLOCK, local.num_kv_heads, local.head_dim)
        caches = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(local.num_layers)]
        logits = []
        with torch.inference_mode():
            for ids, positions, meta in steps:
                hidden = model.forward(ids, positions, meta, caches)
                if rank == 0:
                    logits.append(model.logits(hidden))
        return logits

    with ThreadPoolExecutor(world) as pool:
        return list(pool.map(run_rank, range(world)))[0]
