"""Decode steps replayed from device graphs, one graph per batch-size bucket.

A decode step of ``n`` sequences runs the graph of the smallest bucket ``b >= n``: the step's
inputs are copied into the graph's fixed buffers, rows ``n..b`` padded (token 0, position 0,
KV slot -1 so nothing is stored, length 1, no adapter), the graph replays every kernel of the forward pass
in one launch, and the first ``n`` rows of its output are the step's hidden states. Steps with
prompt tokens replay the graphs of :mod:`.mixed_graphs`; batches above the largest bucket run
eagerly. With LoRA on, the graphs also run the LoRA launches over the adapters' fixed buffers
(:class:`.lora_buffers.LoraBuffers`), which each step fills: a step with adapters replays the
same graph as one without.

Which device captures graphs is :func:`backend_for`'s choice: CUDA does (``torch.cuda.CUDAGraph``).
Ascend NPUs run eagerly: torch_npu's fused attention takes the sequence lengths as host
integers, which a captured graph would freeze. The tests stand a recording backend in for a
device on the CPU (tests/unit/engine/recording_graphs.py).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import torch

from ..models.decoder import DecoderModel
from ..ops.contract import ContractError, check_seq_lens
from ..ops.metadata import AttentionMetadata, LoraStep, PagedAttentionInputs
from .lora_buffers import LoraBuffers
from .step_inputs import StepArrays

log = logging.getLogger("lmiserve.engine")

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
"""Batch sizes that get a graph (vLLM captures a similar ladder): fine steps at small batches,
where padding costs most, coarser ones above."""


def aligned_rows(n: int, itemsize: int) -> int:
    """``n`` rounded up so that rows of ``n`` items of ``itemsize`` bytes each start 16 bytes
    apart: views of a buffer's rows then have the alignment Triton specialises on in every step."""
    per = max(1, 16 // itemsize)
    return -(-n // per) * per


def graph_buckets(max_num_seqs: int, limit: int = 512) -> list[int]:
    """The buckets needed for batches up to ``max_num_seqs`` (at most ``limit``)."""
    top = min(max_num_seqs, limit)
    sizes = [b for b in BUCKETS if b < top]
    return sizes + [min(b for b in (*BUCKETS, top) if b >= top)]


class GraphBackend(Protocol):
    name: str

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """Capture ``fn`` (run once beforehand to warm up); the graph and its output tensor."""

    def replay(self, graph: Any) -> None: ...


class CudaGraphBackend:
    name = "cuda"

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up: Triton compiles its kernels, cuBLAS picks its algorithms
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out

    def replay(self, graph: Any) -> None:
        graph.replay()


def backend_for(device: str) -> GraphBackend | None:
    """The device's graph backend, or None where steps run eagerly."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return CudaGraphBackend()
    return None


class DecodeGraphs:
    """Captured decode steps over fixed input buffers, for every bucket up to ``max_num_seqs``."""

    def __init__(
        self,
        model: DecoderModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_num_seqs: int,
        max_blocks_per_seq: int,
        device: str,
        backend: GraphBackend,
        lora: LoraBuffers | None = None,
    ):
        """With ``lora`` (the adapters' buffers, when LoRA is on) every graph runs the LoRA
        launches, reading the segments each step copies there."""
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.lora = lora
        self.buckets = graph_buckets(max_num_seqs)
        top = self.buckets[-1]
        self.width = max_blocks_per_seq
        # fixed buffers: the graphs read their inputs from here
        self.longs = torch.zeros((3, aligned_rows(top, 8)), dtype=torch.long, device=device)  # ids, positions, slots
        self.seq_lens = torch.ones(top, dtype=torch.int32, device=device)
        self.tables = torch.zeros((top, self.width), dtype=torch.int32, device=device)
        self.cu = torch.arange(top + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple[Any, torch.Tensor]] = {}
        self.metas: dict[int, AttentionMetadata] = {}
        self.replays = 0

    def capture(self) -> float:
        """Capture every bucket, the largest first (the others reuse its memory); seconds taken."""
        started = time.monotonic()
        self.longs[2].fill_(-1)  # warm-up and capture store nothing in the KV cache
        if self.lora is not None:
            self.lora.fill(None)  # and add no adapter
        with _no_grad():
            for b in reversed(self.buckets):
                self.graphs[b] = self.backend.capture(self._forward_fn(b))
        took = time.monotonic() - started
        log.info("captured %d decode graphs (%s backend, batch sizes %s) in %.1f s", len(self.buckets),
                 self.backend.name, ",".join(map(str, self.buckets)), took)  # fmt: skip
        return took

    def _forward_fn(self, b: int) -> Callable[[], torch.Tensor]:
        meta = AttentionMetadata(
            slot_mapping=self.longs[2, :b],
            paged=PagedAttentionInputs(
                block_tables=self.tables[:b],
                cu_q_lens=self.cu[: b + 1],
                seq_lens=self.seq_lens[:b],
                max_q_len=1,
                host_cu_q_lens=list(range(b + 1)),
                host_seq_lens=[1] * b,
                num_decodes=b,
            ),
            lora=None if self.lora is None else LoraStep([], self.lora.ints.device, self.lora.index(b), captured=True),
        )
        self.metas[b] = meta
        ids, positions = self.longs[0, :b], self.longs[1, :b]
        return lambda: self.model.forward(ids, positions, meta, self.kv_caches)

    def bucket_for(self, n: int) -> int | None:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def fits(self, arrays: StepArrays) -> bool:
        """A step the graphs can run: decodes only, few enough, block tables narrow enough (with
        adapters where the graphs were captured with the LoRA launches)."""
        n = arrays.num_seqs
        return (
            n > 0
            and arrays.num_decodes == n
            and n <= self.buckets[-1]
            and arrays.block_tables.shape[1] <= self.width
            and arrays.prompt_lens is None
            and (arrays.lora_slots is None or self.lora is not None)
        )

    def run(self, arrays: StepArrays) -> torch.Tensor:
        """The step's hidden states ``(n, hidden)`` from the smallest bucket's graph."""
        n = arrays.num_seqs
        b = self.bucket_for(n)
        if b is None or not self.fits(arrays):
            raise ContractError(f"a step of {n} sequences does not fit the captured decode graphs")
        lens = arrays.seq_lens
        check_seq_lens(lens.tolist())
        longs = np.zeros((3, b), dtype=np.int64)
        longs[2] = -1
        longs[0, :n], longs[1, :n], longs[2, :n] = arrays.input_ids, arrays.positions, arrays.slots
        padded_lens = np.ones(b, dtype=np.int32)
        padded_lens[:n] = lens
        tables = np.zeros((b, arrays.block_tables.shape[1]), dtype=np.int32)
        tables[:n] = arrays.block_tables
        self.longs[:, :b].copy_(_host(longs), non_blocking=True)
        self.seq_lens[:b].copy_(_host(padded_lens), non_blocking=True)
        self.tables[:b, : tables.shape[1]].copy_(_host(tables), non_blocking=True)
        # the host copy of the lengths follows the buffer, for ops that read it where a
        # backend runs the forward pass again on replay (a device graph never reads it)
        meta = self.metas[b]
        meta.paged.host_seq_lens = padded_lens.tolist()
        if self.lora is not None and meta.lora is not None:  # padding rows are in no segment
            meta.lora.reset(self.lora.fill(arrays))
        if arrays.fill is not None:
            arrays.fill.apply(self.longs[0, :n])
        graph, out = self.graphs[b]
        self.backend.replay(graph)
        self.replays += 1
        return out[:n]


def _host(array: np.ndarray) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.pin_memory() if torch.cuda.is_available() else tensor


@contextlib.contextmanager
def _no_grad() -> Iterator[None]:
    with torch.inference_mode():
        yield
