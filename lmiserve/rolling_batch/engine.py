"""The continuous-batching engine: requests in, token ids out, one step at a time.

Each :meth:`Engine.step` schedules a batch (new requests join, long prompts are chunked,
running sequences decode), runs the model once over every scheduled token, samples, and
reports per sequence what it produced. The engine knows token ids only: text, stop strings
and response formats live above it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import torch

from .. import wire
from ..devices import torch_dtype
from . import graphs
from .beam_search import BeamState
from .beam_step import BeamSteps
from .block_manager import BlockManager
from .engine_config import EngineConfig
from .guided import GuidedDecoder
from .kv_memory import GIB, kv_cache_blocks
from .lora.engine_adapters import EngineAdapters
from .model_runner import ModelRunner, StepLogits
from .models.spec import eos_token_ids, read_config, spec_from_config
from .parallel import TensorParallelError, WorkerRanks, agree_min, check_devices
from .sampler import Sampler
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Group, Sequence
from .shard_check import check_shardable
from .sharding import Shard

log = logging.getLogger("lmiserve.engine")


class RequestRejected(ValueError):
    """The engine cannot take this request (the API layer should have refused it first)."""


class Engine(BeamSteps, EngineAdapters):
    def __init__(self, config: EngineConfig, on_rank_failure: Callable[[str], None] | None = None):
        """``on_rank_failure``: called when a tensor-parallel rank dies while the engine runs
        (the engine process exits); without it, the next step raises :class:`TensorParallelError`."""
        started = time.monotonic()
        self.config = config
        self.spec = spec_from_config(read_config(config.model_dir))
        spec = self.spec
        self.max_model_len = config.max_model_len or spec.max_position_embeddings
        self.eos_token_ids = eos_token_ids(config.model_dir, spec.eos_token_ids)
        self.ranks: WorkerRanks | None = None
        tp = config.tensor_parallel_degree
        if tp > 1:
            check_shardable(spec, tp)
            check_devices(config.device, tp)
            for_ranks = dataclasses.asdict(dataclasses.replace(config, max_model_len=self.max_model_len))
            self.ranks = WorkerRanks(for_ranks, tp, config.device, on_rank_failure)
        try:
            block_bytes = self._load_model(torch_dtype(config.dtype))
            self.guided = GuidedDecoder(config.model_dir, spec.vocab_size, self.eos_token_ids)
        except BaseException:
            self.close()
            raise
        capacity = self.num_blocks * config.block_size
        self.blocks = BlockManager(self.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.blocks,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self.max_model_len,
            config.max_prefill_seqs,
            self.adapters,
            config.max_decode_step_prefill_tokens,
            config.decode_step_prefill_tokens_per_sequence,
        )
        self.sampler = Sampler(config.device, self.runner.ops, self.guided)
        self.groups: dict[str, Group] = {}
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.last_step_seconds = 0.0
        self._step_started = 0.0
        self._step_size = 0
        self.info = {
            "architecture": spec.architecture,
            "dtype": config.dtype,
            "device": config.device,
            "ops": self.runner.ops.name,
            "max_model_len": self.max_model_len,
            "block_size": config.block_size,
            "kv_blocks": self.num_blocks,
            "kv_tokens": capacity,
            "kv_bytes": self.num_blocks * block_bytes,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": self.scheduler.max_num_batched_tokens,
            "decode_prefill_tokens": config.max_decode_step_prefill_tokens or self.scheduler.max_num_batched_tokens,
            "decode_prefill_tokens_per_seq": config.decode_step_prefill_tokens_per_sequence or "off",
            "tensor_parallel_degree": tp,
            "deterministic": "on" if config.deterministic else "off",
            "decode_graphs": ",".join(map(str, self.runner.graphs.buckets)) if self.runner.graphs else "off",
            **self.lora_info(),
        }
        if self.ranks is not None:
            self.info["rank_pids"] = self.ranks.pids
        log.info(
            "engine ready in %.1f s: %s, %s on %s (%s ops); KV cache %d blocks x %d = %d tokens (%.2f GiB), "
            "%.1f sequences of max_model_len %d",
            time.monotonic() - started,
            spec.architecture,
            config.dtype,
            config.device,
            self.runner.ops.name,
            self.num_blocks,
            config.block_size,
            capacity,
            self.num_blocks * block_bytes / GIB,
            capacity / self.max_model_len,
            self.max_model_len,
        )
        if self.ranks is not None:
            log.info(
                "tensor parallel degree %d: each rank holds %d of %d query heads and %d of %d KV heads; "
                "the KV cache above is per rank",
                tp,
                self.runner.spec.num_heads,
                spec.num_heads,
                self.runner.spec.num_kv_heads,
                spec.num_kv_heads,
            )

    def _load_model(self, dtype: torch.dtype) -> int:
        """Load this process's weights and allocate its KV cache; the bytes of one KV block here.

        With tensor parallelism the other ranks load their shards meanwhile; the cache gets the
        number of blocks that fits on every rank."""
        cfg, tp = self.config, self.config.tensor_parallel_degree
        self.runner = ModelRunner(
            cfg.model_dir,
            self.spec,
            dtype,
            cfg.device,
            self.max_model_len,
            cfg.block_size,
            cfg.ops,
            shard=Shard(0, tp) if tp > 1 else None,
            deterministic=cfg.deterministic,
        )
        self._setup_lora(dtype)
        block_bytes = self.runner.block_bytes
        self.num_blocks = self._num_blocks(block_bytes)
        if self.ranks is not None:
            self.ranks.join()
            self.num_blocks = agree_min(self.num_blocks, cfg.device)
        capacity = self.num_blocks * cfg.block_size
        if capacity < self.max_model_len:
            raise ValueError(
                f"the KV cache holds {capacity} tokens, fewer than max_model_len ({self.max_model_len}); "
                "raise option.kv_cache_memory or lower option.max_model_len"
            )
        self.runner.allocate_cache(self.num_blocks)
        if self.ranks is not None:
            self.runner.channel = self.ranks.ready(self.runner.ops.unified_attention)
        elif not cfg.enforce_eager and self.runner.ops.unified_attention:
            backend = graphs.backend_for(cfg.device)
            if backend is not None:
                self.runner.capture_graphs(cfg.max_num_seqs, backend)
        return block_bytes

    def _num_blocks(self, block_bytes: int) -> int:
        return kv_cache_blocks(self.config, self.max_model_len, block_bytes, self.config.device)

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any (a single-process engine holds nothing)."""
        if self.ranks is not None:
            self.ranks.close()

    # --- requests -----------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_ids: list[int], params: wire.SamplingParams, adapter: str = ""
    ) -> None:
        if request_id in self.groups:
            raise RequestRejected(f"request id {request_id!r} is already running")
        if not prompt_ids:
            raise RequestRejected("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise RequestRejected(f"the prompt has {len(prompt_ids)} tokens; max_model_len is {self.max_model_len}")
        if max(prompt_ids) >= self.spec.vocab_size or min(prompt_ids) < 0:
            raise RequestRejected("the prompt holds token ids outside the vocabulary")
        if params.guided is not None:
            try:
                self.guided.check(params.guided)
            except ValueError as exc:
                raise RequestRejected(str(exc)) from None
        group = Group(request_id, params)
        if adapter:
            try:
                group.adapter = self._use_adapter(adapter)
            except ValueError as exc:
                raise RequestRejected(str(exc)) from None
        if params.num_beams > 1:
            if params.n > params.num_beams:
                raise RequestRejected(f"n ({params.n}) must not exceed num_beams ({params.num_beams})")
            seq = Sequence(group, 0, list(prompt_ids), len(prompt_ids))
            group.sequences.append(seq)
            group.beam = BeamState(
                params.num_beams, params.n, params.length_penalty, params.early_stopping, [seq], [0.0]
            )
        else:
            for index in range(max(params.best_of, params.n, 1)):
                group.sequences.append(Sequence(group, index, list(prompt_ids), len(prompt_ids)))
        self.groups[request_id] = group
        self.scheduler.add(group)

    def abort(self, request_id: str, index: int | None = None) -> None:
        """Stop a request (or one of its sequences); its blocks are free for the next step."""
        group = self.groups.get(request_id)
        if group is None:
            return
        for seq in group.sequences:
            if index is None or seq.index == index:
                self.scheduler.finish(seq, "abort")
                self.sampler.forget(seq)
        self._maybe_done(group)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # --- one step -------------------------------------------------------------------------
    def step(self) -> list[wire.SeqDelta]:
        started = time.monotonic()
        out = self.scheduler.schedule()
        if not out:
            return []
        deltas: list[wire.SeqDelta] = []
        self._step_started = started
        self._step_size = len(out.scheduled)
        for item in out.scheduled:
            if item.seq.first_scheduled is None:
                item.seq.first_scheduled = started
        self._fill_slots()
        self._run(out, deltas)
        ended = time.monotonic()
        for item in out.scheduled:
            if item.samples:
                item.seq.ready_since = ended
        self.last_step_seconds = ended - started
        return deltas

    def _run(self, out: SchedulerOutput, deltas: list[wire.SeqDelta]) -> None:
        """Run ``out``; if it fails, split it until the failing sequences are found and end only those."""
        try:
            if self.ranks is not None:
                self.ranks.check()
            step = self.runner.execute(out)
            self._advance(out, step, deltas)
        except TensorParallelError:
            raise  # the ranks are out of step: nothing can be retried
        except Exception as exc:  # noqa: BLE001 - isolate the request(s) at fault
            items = out.scheduled
            if len(items) == 1:
                seq = items[0].seq
                log.exception("request %s failed", seq.request_id)
                deltas.append(self._fail(seq, f"{type(exc).__name__}: {exc}"))
                return
            log.warning("a batch of %d sequences failed (%s); retrying them in halves", len(items), exc)
            half = len(items) // 2
            for part in (items[:half], items[half:]):
                live = [i for i in part if not i.seq.finished]
                if live:
                    self._run(SchedulerOutput.of(live), deltas)

    def _fail(self, seq: Sequence, error: str) -> wire.SeqDelta:
        self.scheduler.finish(seq, "error")
        self.sampler.forget(seq)
        self._maybe_done(seq.group)
        return wire.SeqDelta(request_id=seq.request_id, index=seq.index, finish_reason="error", error=error)

    def _advance(self, out: SchedulerOutput, step: StepLogits, deltas: list[wire.SeqDelta]) -> None:
        # everything that can fail happens before any state changes, so a failed step can be retried
        prompt_values = self._prompt_logprobs(out, step)
        rows = {item.seq.seq_id: i for i, item in enumerate(step.sampled)}
        beam_groups = {id(i.seq.group): i.seq.group for i in step.sampled if i.seq.group.beam is not None}
        seqs = [item.seq for item in step.sampled if item.seq.group.beam is None]
        result = None
        if seqs:
            logits = step.sample_logits
            if beam_groups:
                keep = torch.tensor([rows[s.seq_id] for s in seqs], dtype=torch.long, device=logits.device)
                logits = logits.index_select(0, keep)
            result = self.sampler.sample(logits, seqs, self.eos_token_ids)
        self.scheduler.after_step(out)
        self.prompt_tokens += sum(min(i.num_tokens, max(0, i.seq.num_prompt_tokens - i.start)) for i in out.prefills)
        for seq, (values, top) in prompt_values.items():
            seq.prompt_logprobs.extend(values)
            seq.prompt_top_logprobs.extend(top)
        for group in beam_groups.values():
            self._beam_step(group, step.sample_logits, rows, deltas)
        if result is None:
            return
        for i, seq in enumerate(seqs):
            token, lp = result.token_ids[i], result.logprobs[i]
            seq.token_ids.append(token)
            self.guided.accept(seq, token)
            seq.cumulative_logprob += lp
            self.generated_tokens += 1
            reason = self._finish_reason(seq, token)
            delta = wire.SeqDelta(
                request_id=seq.request_id,
                index=seq.index,
                token_ids=[token],
                logprobs=[lp],
                cumulative_logprob=seq.cumulative_logprob,
                finish_reason=reason,
                batch_size=self._step_size,
                queue_us=self._queue_us(seq),
            )
            if result.top is not None:
                delta.top_logprobs = [[wire.TopLogprob(t, v) for t, v in result.top[i]]]
            if seq.num_generated == 1:
                delta.num_prompt_tokens = seq.num_prompt_tokens
                delta.num_cached_tokens = seq.num_cached_prompt_tokens
                if seq.params.prompt_logprobs is not None:
                    delta.prompt_logprobs = list(seq.prompt_logprobs)
                    if seq.params.prompt_logprobs > 0:
                        delta.prompt_top_logprobs = [
                            [wire.TopLogprob(t, v) for t, v in row] for row in seq.prompt_top_logprobs
                        ]
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self.sampler.forget(seq)
                self._maybe_done(seq.group)
            deltas.append(delta)

    def _queue_us(self, seq: Sequence) -> int:
        """How long the sequence waited for this token: before its first step for the first
        token, then between the step that produced its previous token and this one."""
        if seq.num_generated == 1:
            waited = (seq.first_scheduled or self._step_started) - seq.ready_since
        else:
            waited = self._step_started - seq.ready_since
        return max(0, int(waited * 1e6))

    def _prompt_logprobs(self, out: SchedulerOutput, step: StepLogits) -> dict[Sequence, tuple[list, list]]:
        """This step's prompt log-probabilities (and top alternatives) per sequence that asked."""
        found: dict[Sequence, tuple[list, list]] = {}
        for item in out.prefills:
            seq = item.seq
            if seq.seq_id not in step.prompt_rows:
                continue
            first, count = step.prompt_rows[seq.seq_id]
            targets, rows = [], []
            for r in range(count):
                pos = item.start + r
                if pos + 1 < seq.num_prompt_tokens:
                    targets.append(seq.token_ids[pos + 1])
                    rows.append(first + r)
            if targets:
                values, top = self.sampler.prompt_logprobs(step.logits[rows], targets, seq.params.prompt_logprobs or 0)
                found[seq] = (values, top or [])
        return found

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if seq.num_generated >= p.min_new_tokens:
            if token in p.stop_token_ids:
                return "stop_sequence"
            if not p.ignore_eos and token in self.eos_token_ids:
                return "eos_token"
        if seq.num_generated >= p.max_new_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _maybe_done(self, group: Group) -> None:
        if all(s.finished for s in group.sequences) and self.groups.pop(group.request_id, None) is not None:
            self._adapter_done(group)

    def stats(self) -> wire.EngineStats:
        return wire.EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_used=self.blocks.num_used_blocks,
            kv_blocks_total=self.blocks.num_blocks,
            prefix_cache_hit_tokens=self.blocks.prefix_hit_tokens,
            preemptions=self.scheduler.num_preemptions,
            prompt_tokens=self.prompt_tokens,
            generated_tokens=self.generated_tokens,
            step_seconds=self.last_step_seconds,
            **self.adapter_stats(),
        )
