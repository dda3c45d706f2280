"""Running a scheduled step: its inputs as tensors, the model over every scheduled token (eagerly
or from a captured graph), logits for the rows that need them, and the sampled tokens."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import torch

from ..models.image_attention import ImageBlock
from ..models.registry import decoder_class
from ..models.rope import rope_tables
from ..models.spec import ModelSpec
from ..models.vision.registry import split_vision
from ..ops import select_ops
from ..quant.int8_activations import with_int8_activations
from ..quant.loading import load_weights
from ..scheduling.scheduler import SchedulerOutput
from .graphs import DecodeGraphs, GraphBackend, graph_buckets
from .image_rows import ImageRows, rope_positions, shift_decodes
from .lora_buffers import LoraBuffers
from .mixed_graphs import MixedGraphs, mixed_seq_buckets, prompt_token_buckets
from .parallel import StepChannel, TensorParallelError
from .phase_log import PhaseLog
from .sampler import DeviceSamples, LogitRows, Sampler, StepResult
from .sharding import Shard, local_spec, shard_pieces
from .step_inputs import StepArrays, TokenFill, build_step_arrays, device_tensor, step_tensors
from .verify import Verifier
from .warmup import StepKey, eager_key

log = logging.getLogger("lmiserve.engine")


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
        quantize: str | None = None,
        gguf_dense_rows: int = 0,
        int8_activations: bool = False,
    ):
        """With a ``shard`` of a tensor-parallel group, this process loads and runs only its
        part of every layer (``spec`` becomes that part) and rank 0 alone keeps the LM head.
        ``gguf_dense_rows``: :attr:`..engine_config.EngineConfig.gguf_dense_rows`; ``int8_activations``:
        ``option.quantize_activations=int8``."""
        self.device = device
        self.dtype = dtype
        self.images: ImageRows | None = None
        """A vision-language model's image embeddings (None: text only)."""
        self.deterministic = deterministic
        self.block_size = block_size
        phases = PhaseLog(log, "engine start")
        self.ops = select_ops(device, ops_name, deterministic, gguf_dense_rows, int8_activations)
        phases.done("ops and their kernels")
        self.channel: StepChannel | None = None
        """Set on rank 0 of a tensor-parallel group: each step's inputs go to the other ranks."""
        cos, sin = rope_tables(model_dir, spec.architecture, max_model_len)
        phases.done("rotary tables")
        if shard is None or shard.world_size == 1:
            self.spec = spec
            formats = self.ops.native_formats
            tensors, self.quantization = load_weights(
                model_dir, dtype, device, quantize, formats, embed_blocks=int8_activations
            )
            phases.done("weights read")
            vision, tensors = split_vision(spec, model_dir, tensors, dtype, device, self.ops)
            if vision is not None:
                self.images = ImageRows(
                    vision, spec.image_token_id, deterministic, bidirectional=spec.vision == "gemma3"
                )
            self.model = decoder_class(spec)(spec, tensors, self.ops, cos, sin)
            phases.done("layers built")
        else:
            import torch.distributed as dist

            self.spec = local_spec(spec, shard)
            head = shard.rank == 0
            pieces = shard_pieces(spec, shard, lm_head=head)
            formats = self.ops.native_formats
            tensors, self.quantization = load_weights(model_dir, dtype, device, quantize, formats, pieces)
            self.model = decoder_class(spec)(
                self.spec, tensors, self.ops, cos, sin, all_reduce=dist.all_reduce, lm_head=head
            )
        if int8_activations:
            self.quantization = with_int8_activations(tensors, self.quantization)
        del tensors
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.graphs: DecodeGraphs | None = None
        """Captured decode steps (CUDA graphs), once :meth:`capture_graphs` has run."""
        self.mixed_graphs: MixedGraphs | None = None
        """Captured steps with prompt tokens, likewise."""
        self.lora_buffers: LoraBuffers | None = None
        """The adapter segments the graphs read, when they were captured with LoRA on."""
        self.steps: Counter[StepKey] = Counter()
        """Forward passes run, by kind and bucket (:mod:`.warmup`)."""
        self.warm_keys: set[StepKey] = set()
        """The kinds and buckets of step run (or captured) before the engine was ready."""
        self.max_model_len = max_model_len
        self.sampler: Sampler | None = None
        """Set where this process samples (rank 0): with the guided decoder, once it is loaded."""
        self.eos_token_ids: tuple[int, ...] = ()
        self.verifier: Verifier | None = None
        self.last_hidden: torch.Tensor | None = None
        """The last step's hidden states (a proposer that reads them takes its rows after the step)."""

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

    def kernel_compiles(self) -> int:
        """Device kernels compiled in this process so far (Triton's; 0 for the other ops)."""
        if self.ops.name != "cuda":
            return 0
        from ..ops.triton_kernels import compiles

        return compiles.count()

    @property
    def graph_steps(self) -> int:
        return sum(n for key, n in self.steps.items() if key[0] != "eager")

    @property
    def eager_steps(self) -> int:
        return sum(n for key, n in self.steps.items() if key[0] == "eager")

    def capture_graphs(self, max_num_seqs: int, backend: GraphBackend, prompt_tokens: int = 0) -> None:
        """Capture decode steps for every batch-size bucket up to ``max_num_seqs`` and, with
        ``prompt_tokens`` (the prompt tokens a decoding step may take), steps with prompt
        tokens for every bucket of :mod:`.mixed_graphs`, the largest first. Deterministic mode
        on the CPU captures decodes only (its attention splits a step by the lengths on the
        host); on CUDA its kernels are sized from shapes and the bucket's bound alone, so it
        captures both. With LoRA on (the model's adapter pool set), every graph includes the
        LoRA launches."""
        width = -(-self.max_model_len // self.block_size)
        mixed_on = prompt_tokens > 0 and (not self.deterministic or self.ops.name == "cuda")
        lora = self._lora_buffers(max_num_seqs, prompt_tokens if mixed_on else 0)
        if mixed_on:
            mixed = MixedGraphs(
                self.model, self.kv_caches, max_num_seqs, prompt_tokens, width, self.block_size, self.device, backend,
                lora,
            )  # fmt: skip
            mixed.capture()
            self.mixed_graphs = mixed
            self.warm_keys.update(("mixed", key) for key in mixed.buckets)
        graphs = DecodeGraphs(self.model, self.kv_caches, max_num_seqs, width, self.device, backend, lora)
        graphs.capture()
        self.graphs = graphs
        self.warm_keys.update(("decode", b) for b in graphs.buckets)

    def _lora_buffers(self, max_num_seqs: int, prompt_tokens: int) -> LoraBuffers | None:
        """The adapters' buffers every graph reads, sized for the largest bucket's token rows
        (decode or mixed), when LoRA is on."""
        pool = self.model.lora
        if pool is None:
            return None
        rows = graph_buckets(max_num_seqs)[-1]
        if prompt_tokens > 0:
            rows = max(rows, mixed_seq_buckets(max_num_seqs)[-1] + 1 + prompt_token_buckets(prompt_tokens)[-1])
        widest = max(a.shape[1] for a, _ in pool.layers[0].values())
        self.lora_buffers = LoraBuffers(pool.slots, rows, widest, self.device)
        return self.lora_buffers

    def run_eager(
        self,
        arrays: StepArrays,
        inserts: tuple[torch.Tensor, torch.Tensor] | None = None,
        rope: torch.Tensor | None = None,
        image_blocks: list[ImageBlock] | None = None,
    ) -> torch.Tensor:
        """Hidden states of every token of the step, without a graph (``inserts``: image
        embeddings in place of rows' token embeddings; ``rope``: multimodal rotary positions;
        ``image_blocks``: pictures attended both ways)."""
        input_ids, positions, meta = step_tensors(arrays, self.device)
        return self.model.forward(input_ids, positions, meta, self.kv_caches, inserts, rope, image_blocks)

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
        arrays = build_step_arrays(out, self.block_size, not self.deterministic)
        self.steps[eager_key(arrays)] += 1
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
    def run(self, out: SchedulerOutput) -> StepResult:
        """Run the step and sample the next token of every sequence that reached its end, the
        tokens read back to the host (beam searches and prompt log-probabilities included)."""
        hidden = self._forward(out)
        self.last_hidden = hidden
        rows = LogitRows.of(out.decodes, out.prefills, out.verifies)
        if not rows.hidden_rows:
            return StepResult()
        assert self.sampler is not None
        logits = self._logits(hidden, rows)
        result = self.sampler.step(logits, rows, out.prefills, self.eos_token_ids)
        if rows.verified:
            if self.verifier is None:
                self.verifier = Verifier(self.sampler, self.deterministic)
            result.verified = self.verifier.check(logits, rows, self.eos_token_ids)
        return result

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, fill: TokenFill | None = None) -> DeviceSamples | None:
        """:meth:`run` without the read-back: the tokens stay on the device (the overlapped
        engine's device half, which collects them later, :mod:`..core.overlap`): one token per
        sequence that reached its end, in :class:`LogitRows` order, for a step without beams or
        prompt log-probabilities. ``fill`` gives the input ids still on the device."""
        hidden = self._forward(out, fill)
        self.last_hidden = hidden
        rows = LogitRows.of(out.decodes, out.prefills)
        if not rows.hidden_rows:
            return None
        assert self.sampler is not None
        seqs = [item.seq for item in rows.sampled]
        return self.sampler.sample_on_device(self._logits(hidden, rows), seqs, self.eos_token_ids)

    def step_hidden(self, kind: str) -> torch.Tensor:
        """The last step's hidden states a proposer reads: ``final`` (after the final norm) or ``aux``
        (the streams entering the layers ``model.aux_layers`` names)."""
        hidden = self.model.aux_hidden if kind == "aux" else self.last_hidden
        assert hidden is not None
        return hidden

    def _logits(self, hidden: torch.Tensor, rows: LogitRows) -> torch.Tensor:
        if rows.hidden_rows == list(range(len(rows.hidden_rows))):
            selected = hidden[: len(rows.hidden_rows)]
        else:
            selected = hidden.index_select(0, device_tensor(rows.hidden_rows, torch.long, self.device))
        return self.model.logits(selected)

    def _forward(self, out: SchedulerOutput, fill: TokenFill | None = None) -> torch.Tensor:
        """Hidden states of every token of the step."""
        if self.channel is not None:
            return self._forward_parallel(out, self.channel)
        if out.copies:
            self.copy_blocks(out.copies)
            out.copies = []  # a retried step must not copy again
        arrays = build_step_arrays(out, self.block_size, not self.deterministic)
        arrays.fill = fill
        if self.images is not None:  # a step with pictures' embeddings or positions runs eagerly
            inserts = self.images.inserts(out) if out.prefills else None
            rope = None
            if self.images.mrope and out.prefills:
                rope = rope_positions(out)
            elif self.images.mrope:  # decodes only: one position each, shifted past their pictures
                shift_decodes(arrays, out)
            if inserts is not None or rope is not None:
                self.steps[eager_key(arrays)] += 1
                positions = None if rope is None else torch.from_numpy(rope).to(self.device)
                return self.run_eager(arrays, inserts, positions, self.images.image_blocks(out))
        if self.graphs is not None and self.graphs.fits(arrays):
            self.steps[("decode", self.graphs.bucket_for(arrays.num_seqs))] += 1
            return self.graphs.run(arrays)
        if self.mixed_graphs is not None and self.mixed_graphs.fits(arrays):
            self.steps[("mixed", self.mixed_graphs.bucket_for(arrays))] += 1
            return self.mixed_graphs.run(arrays)
        self.steps[eager_key(arrays)] += 1
        return self.run_eager(arrays)
