"""Turning a scheduled step into tensors, running the model, and returning the logits to sample from."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .graphs import DecodeGraphs, GraphBackend
from .models.decoder import AttentionMetadata, DecoderModel
from .models.rope import rope_tables
from .models.spec import ModelSpec
from .models.weights import load_state_dict
from .ops import select_ops
from .parallel import StepChannel, TensorParallelError
from .scheduler import ScheduledSeq, SchedulerOutput
from .sharding import Shard, local_spec, shard_pieces
from .step_inputs import build_step_arrays, step_tensors

log = logging.getLogger("lmiserve.engine")


@dataclass
class StepLogits:
    """Logits of one step: first one row per sequence that samples (in ``sampled`` order),
    then, for sequences that asked for prompt log-probabilities, their prompt rows."""

    logits: torch.Tensor
    sampled: list[ScheduledSeq]
    prompt_rows: dict[int, tuple[int, int]] = field(default_factory=dict)
    """seq_id -> (first row, count): rows predicting the chunk's next prompt tokens."""

    @property
    def sample_logits(self) -> torch.Tensor:
        return self.logits[: len(self.sampled)]


class ModelRunner:
    def __init__(
        self,
        model_dir: Path,
        spec: ModelSpec,
        dtype: torch.dtype,
        device: str,
        max_model_len: int,
        block_size: int,
        ops_name: str = "auto",
        shard: Shard | None = None,
        deterministic: bool = False,
    ):
        """With a ``shard`` of a tensor-parallel group, this process loads and runs only its
        part of every layer (``spec`` becomes that part) and rank 0 alone keeps the LM head."""
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        self.ops = select_ops(device, ops_name, deterministic)
        self.channel: StepChannel | None = None
        """Set on rank 0 of a tensor-parallel group: each step's inputs go to the other ranks."""
        cos, sin = rope_tables(model_dir, spec.architecture, max_model_len)
        if shard is None or shard.world_size == 1:
            self.spec = spec
            tensors = load_state_dict(model_dir, dtype, device)
            self.model = DecoderModel(spec, tensors, self.ops, cos, sin)
        else:
            import torch.distributed as dist

            self.spec = local_spec(spec, shard)
            head = shard.rank == 0
            tensors = load_state_dict(model_dir, dtype, device, shard_pieces(spec, shard, lm_head=head))
            self.model = DecoderModel(self.spec, tensors, self.ops, cos, sin, all_reduce=dist.all_reduce, lm_head=head)
        del tensors
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.graphs: DecodeGraphs | None = None
        """Captured decode steps (CUDA graphs), once :meth:`capture_graphs` has run."""
        self.max_model_len = max_model_len

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block in this process (its own KV heads only)."""
        spec = self.spec
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * spec.num_layers * self.block_size * spec.num_kv_heads * spec.head_dim * itemsize

    def allocate_cache(self, num_blocks: int) -> None:
        """The paged KV cache: per layer, K and V each (num_blocks, block_size, kv_heads, head_dim).

        Written once here, so that no request pays for the operating system providing its
        memory for the first time (a page fault per fresh block, tens of microseconds each).
        """
        spec = self.spec
        shape = (spec.num_layers, num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim)
        self.k_cache = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.kv_caches = [(self.k_cache[i], self.v_cache[i]) for i in range(spec.num_layers)]

    def capture_graphs(self, max_num_seqs: int, backend: GraphBackend) -> None:
        """Capture decode steps for every batch-size bucket up to ``max_num_seqs``."""
        width = -(-self.max_model_len // self.block_size)
        graphs = DecodeGraphs(self.model, self.kv_caches, max_num_seqs, width, self.device, backend)
        graphs.capture()
        self.graphs = graphs

    # --- inputs ---------------------------------------------------------------------------
    def prepare(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        arrays = build_step_arrays(out, self.block_size)
        return step_tensors(arrays, self.device, self.ops.unified_attention)

    # --- execution ------------------------------------------------------------------------
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks in every layer (copy-on-write of blocks shared by beams)."""
        src = torch.tensor([s for s, _ in copies], dtype=torch.long, device=self.device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.long, device=self.device)
        self.copy_block_tensors(src, dst)

    def copy_block_tensors(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.k_cache[:, dst] = self.k_cache[:, src]
        self.v_cache[:, dst] = self.v_cache[:, src]

    def _forward_parallel(self, out: SchedulerOutput, channel: StepChannel) -> torch.Tensor:
        """Rank 0 of a tensor-parallel group: send the step to the other ranks and run it with
        them. Once the step is sent, any failure is fatal: the ranks are no longer in step, so
        the channel is marked broken and no further step is sent."""
        if channel.broken is not None:
            raise TensorParallelError(channel.broken)
        arrays = build_step_arrays(out, self.block_size)
        copies, out.copies = out.copies, []  # a retried step must not copy again
        try:
            input_ids, pos, meta, block_copies = channel.send(arrays, copies)
            if block_copies is not None:
                self.copy_block_tensors(*block_copies)
            return self.model.forward(input_ids, pos, meta, self.kv_caches)
        except Exception as exc:
            channel.broken = f"a tensor-parallel step failed: {type(exc).__name__}: {exc}"
            raise TensorParallelError(channel.broken) from exc

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepLogits:
        if self.channel is not None:
            hidden = self._forward_parallel(out, self.channel)
        else:
            if out.copies:
                self.copy_blocks(out.copies)
                out.copies = []  # a retried step must not copy again
            arrays = build_step_arrays(out, self.block_size)
            if self.graphs is not None and self.graphs.fits(arrays):
                hidden = self.graphs.run(arrays)
            else:
                input_ids, positions, meta = step_tensors(arrays, self.device, self.ops.unified_attention)
                hidden = self.model.forward(input_ids, positions, meta, self.kv_caches)
        sampled: list[ScheduledSeq] = []
        sample_rows: list[int] = []
        prompt_spans: list[tuple[int, int, int]] = []  # (seq_id, first hidden row, count)
        for i, item in enumerate(out.decodes):
            if item.samples:
                sampled.append(item)
                sample_rows.append(i)
        offset = len(out.decodes)
        for item in out.prefills:
            seq = item.seq
            if seq.params.prompt_logprobs is not None and item.start < seq.num_prompt_tokens:
                prompt_spans.append((seq.seq_id, offset, min(item.num_tokens, seq.num_prompt_tokens - item.start)))
            if item.samples:
                sampled.append(item)
                sample_rows.append(offset + item.num_tokens - 1)
            offset += item.num_tokens
        rows = list(sample_rows)
        prompt_rows: dict[int, tuple[int, int]] = {}
        for seq_id, first, count in prompt_spans:
            prompt_rows[seq_id] = (len(rows), count)
            rows.extend(range(first, first + count))
        if not rows:
            return StepLogits(hidden.new_empty((0, 0)).float(), sampled, prompt_rows)
        if rows == list(range(len(rows))):
            selected = hidden[: len(rows)]
        else:
            selected = hidden.index_select(0, torch.tensor(rows, dtype=torch.long, device=self.device))
        return StepLogits(self.model.logits(selected), sampled, prompt_rows)
