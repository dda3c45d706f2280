"""Steps with prompt tokens replayed from device graphs, one graph per (sequences, tokens) bucket.

A step of ``n`` sequences and ``t`` tokens has ``t - n`` *extra* tokens: the prompt tokens
beyond one per sequence (a decode has none). Bucket ``(b, p)`` takes up to ``b`` sequences and
up to ``p`` extra tokens; its graph runs ``b + 1`` sequence rows and ``b + 1 + p`` token rows:

- the step's sequences and tokens first, as the eager step lays them out (decodes first);
- each unused sequence row before the last is a one-token dummy: length 1, block table of
  zeros, KV slot -1 (it stores nothing, and reads only itself);
- the last sequence row owns every token row left (at least one): a causal run of
  ``p + 1 - (t - n)`` tokens over the zero block table, also at slot -1.

So every run of query rows is at most ``p + 1`` long whatever the step holds, and the attention
launch is sized by that bound (``max_q_len = p + 1``): its grid, tile sizes and compile-time
constants depend on the bucket alone; programs past a sequence's own run return at once. All
the kernels read from fixed buffers, which each step overwrites; with LoRA on, so do the LoRA
launches (their segments name the step's rows only, never the padding).

The ladder: ``b`` takes the powers of two up to ``max_num_seqs`` (and that limit itself); ``p``
takes the step's prompt-token limit for steps that decode (``max_decode_step_prefill_tokens``,
capped at :data:`MAX_PROMPT_TOKENS`), halved up to three times (multiples of 16). That is at
most 4 graphs per sequence bucket: 40 for ``max_num_seqs`` 512. Steps outside it run eagerly.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..models.decoder import DecoderModel
from ..ops.contract import ContractError
from ..ops.metadata import AttentionMetadata, LoraStep, PagedAttentionInputs
from .graphs import GraphBackend, _host, _no_grad, aligned_rows
from .lora_buffers import LoraBuffers
from .step_inputs import StepArrays

log = logging.getLogger("lmiserve.engine")

MAX_PROMPT_TOKENS = 2048
"""The most extra tokens a captured step takes; steps with more run eagerly."""
LADDER_STEPS = 4
"""Token buckets per sequence bucket."""


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def mixed_seq_buckets(max_num_seqs: int, limit: int = 512) -> list[int]:
    """Sequence capacities of the mixed graphs: powers of two below the limit, then the limit."""
    top = max(1, min(max_num_seqs, limit))
    sizes = []
    b = 1
    while b < top:
        sizes.append(b)
        b *= 2
    return sizes + [top]


def prompt_token_buckets(prompt_tokens: int) -> list[int]:
    """Extra-token capacities: the limit (rounded up to 16, at most :data:`MAX_PROMPT_TOKENS`)
    and up to three halvings of it, each a multiple of 16."""
    top = _round_up(max(16, min(prompt_tokens, MAX_PROMPT_TOKENS)), 16)
    return sorted({max(16, _round_up(top >> k, 16)) for k in range(LADDER_STEPS)})


class MixedGraphs:
    """Captured mixed steps over fixed input buffers, for every ``(b, p)`` bucket."""

    def __init__(
        self,
        model: DecoderModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_num_seqs: int,
        prompt_tokens: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: str,
        backend: GraphBackend,
        lora: LoraBuffers | None = None,
    ):
        """With ``lora``, every graph runs the LoRA launches too (as :class:`.graphs.DecodeGraphs`)."""
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.lora = lora
        self.seq_buckets = mixed_seq_buckets(max_num_seqs)
        self.token_buckets = prompt_token_buckets(prompt_tokens)
        rows = self.seq_buckets[-1] + 1
        tokens = rows + self.token_buckets[-1]
        # the padding run reads its own rows' blocks: the table is wide enough for it too
        self.width = max(max_blocks_per_seq, -(-(self.token_buckets[-1] + 1) // block_size))
        self.step_width = max_blocks_per_seq
        # fixed buffers, each its own allocation (aligned the same way in every step)
        self.longs = torch.zeros((3, aligned_rows(tokens, 8)), dtype=torch.long, device=device)
        self.tables = torch.zeros((rows, self.width), dtype=torch.int32, device=device)
        self.cu = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.metas: dict[tuple[int, int], AttentionMetadata] = {}
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
        self.replays = 0

    @property
    def buckets(self) -> list[tuple[int, int]]:
        return [(b, p) for b in self.seq_buckets for p in self.token_buckets]

    def capture(self) -> float:
        """Capture every bucket, the largest first (the others reuse its memory); seconds taken."""
        started = time.monotonic()
        if self.lora is not None:
            self.lora.fill(None)  # capture adds no adapter
        with _no_grad():
            for key in sorted(self.buckets, reverse=True):
                longs, ints, nd = _layout(*key, None)  # a step of padding only
                fn = self._forward_fn(key)
                self._fill(key, longs, ints, nd)
                self.graphs[key] = self.backend.capture(fn)
        took = time.monotonic() - started
        log.info("captured %d mixed-step graphs (%s backend, sequences %s x prompt tokens %s) in %.1f s",
                 len(self.graphs), self.backend.name, ",".join(map(str, self.seq_buckets)),
                 ",".join(map(str, self.token_buckets)), took)  # fmt: skip
        return took

    def _forward_fn(self, key: tuple[int, int]) -> Callable[[], torch.Tensor]:
        b, p = key
        s, t = b + 1, b + 1 + p
        meta = AttentionMetadata(
            slot_mapping=self.longs[2, :t],
            paged=PagedAttentionInputs(
                block_tables=self.tables[:s],
                cu_q_lens=self.cu[: s + 1],
                seq_lens=self.seq_lens[:s],
                max_q_len=p + 1,  # the bucket's bound: the launch never depends on the step
                host_cu_q_lens=[],  # set by every fill
                host_seq_lens=[],
                num_decodes=0,
            ),
            lora=None if self.lora is None else LoraStep([], self.lora.ints.device, self.lora.index(t), captured=True),
        )
        self.metas[key] = meta
        ids, positions = self.longs[0, :t], self.longs[1, :t]
        return lambda: self.model.forward(ids, positions, meta, self.kv_caches)

    def bucket_for(self, arrays: StepArrays) -> tuple[int, int] | None:
        """The smallest bucket that takes the step, or None."""
        n = arrays.num_seqs
        i = bisect.bisect_left(self.seq_buckets, n)
        j = bisect.bisect_left(self.token_buckets, arrays.num_tokens - n)
        if i == len(self.seq_buckets) or j == len(self.token_buckets):
            return None
        return self.seq_buckets[i], self.token_buckets[j]

    def fits(self, arrays: StepArrays) -> bool:
        """A step with prompt tokens, none generated before (:mod:`..ops.generated_rows`), small
        enough (with adapters where captured with LoRA)."""
        return (
            0 < arrays.num_seqs
            and arrays.num_decodes < arrays.num_seqs
            and arrays.block_tables.shape[1] <= self.step_width
            and arrays.prompt_lens is None
            and (arrays.lora_slots is None or self.lora is not None)
            and self.bucket_for(arrays) is not None
        )

    def run(self, arrays: StepArrays) -> torch.Tensor:
        """The step's hidden states ``(t, hidden)`` from its bucket's graph."""
        key = self.bucket_for(arrays) if self.fits(arrays) else None
        if key is None:
            raise ContractError(
                f"a step of {arrays.num_seqs} sequences and {arrays.num_tokens} tokens does not fit the mixed graphs"
            )
        self._fill(key, *_layout(*key, arrays))
        meta = self.metas[key]
        if self.lora is not None and meta.lora is not None:  # the step's rows come first, as eagerly
            meta.lora.reset(self.lora.fill(arrays))
        if arrays.fill is not None:  # input ids sampled by the step before, still on the device
            arrays.fill.apply(self.longs[0, : arrays.num_tokens])
        graph, out = self.graphs[key]
        self.backend.replay(graph)
        self.replays += 1
        return out[: arrays.num_tokens]

    def _fill(self, key: tuple[int, int], longs: np.ndarray, ints: tuple[np.ndarray, ...], nd: int) -> None:
        """Copy a laid-out step into the buffers; the host copies of the lengths follow it (ops
        that read them run again on replay where the backend reruns the forward pass)."""
        tables, cu, lens = ints
        s, t = lens.shape[0], longs.shape[1]
        self.longs[:, :t].copy_(_host(longs), non_blocking=True)
        # columns past the step's width keep block ids of earlier steps: only the padding run
        # reaches them, and any block id there is a valid one to read
        self.tables[:s, : tables.shape[1]].copy_(_host(tables), non_blocking=True)
        self.cu[: s + 1].copy_(_host(cu), non_blocking=True)
        self.seq_lens[:s].copy_(_host(lens), non_blocking=True)
        meta = self.metas.get(key)
        if meta is not None:
            paged = meta.paged
            paged.host_cu_q_lens, paged.host_seq_lens, paged.num_decodes = cu.tolist(), lens.tolist(), nd
            paged._parts = None


def _layout(b: int, p: int, arrays: StepArrays | None) -> tuple[np.ndarray, tuple[np.ndarray, ...], int]:
    """The step padded to bucket ``(b, p)``: ``(ids, positions, slots)`` ``(3, T)``, the block
    tables, cumulative query lengths and sequence lengths, and the number of decodes."""
    s, t = b + 1, b + 1 + p
    n = 0 if arrays is None else arrays.num_seqs
    used = 0 if arrays is None else arrays.num_tokens
    longs = np.zeros((3, t), dtype=np.int64)
    longs[2] = -1
    width = 1 if arrays is None else max(1, arrays.block_tables.shape[1])
    tables = np.zeros((s, width), dtype=np.int32)
    q_lens = np.ones(s, dtype=np.int64)
    lens = np.ones(s, dtype=np.int32)
    nd = 0
    if arrays is not None:
        longs[0, :used], longs[1, :used], longs[2, :used] = arrays.input_ids, arrays.positions, arrays.slots
        tables[:n, : arrays.block_tables.shape[1]] = arrays.block_tables
        q_lens[:n] = np.diff(arrays.cu_q_lens)
        lens[:n] = arrays.seq_lens
        nd = arrays.num_decodes
    # the dummies (rows n .. s-2) take one token each; the last row takes the rest
    rest = t - used - (s - 1 - n)
    q_lens[s - 1] = lens[s - 1] = rest
    cu = np.zeros(s + 1, dtype=np.int32)
    np.cumsum(q_lens, out=cu[1:])
    return longs, (tables, cu, lens), nd
