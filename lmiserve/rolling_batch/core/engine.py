"""The continuous-batching engine: requests in, token ids out, one step at a time.

Each :meth:`Engine.step` schedules a batch (new requests join, long prompts are chunked,
running sequences decode), runs it (the model once over every scheduled token, then
sampling), and updates the sequences with what it produced, reporting per sequence a delta.
The engine knows token ids only: text, stop strings and response formats live above it.
Start-up (weights, KV cache, graphs) is :mod:`..runner.startup`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ... import wire
from ..engine_config import EngineConfig
from ..runner import replay
from ..runner.parallel import TensorParallelError
from ..runner.sampler import SampleResult, StepResult, finite
from ..runner.startup import describe, start
from ..scheduling.block_manager import BlockManager
from ..scheduling.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from ..scheduling.sequence import Group, Sequence
from . import faults
from .beam_search import BeamSearch
from .outputs import OutputBuilder, error_delta
from .overlap import OverlappedSteps, overlap_enabled
from .speeds import StepSpeeds

log = logging.getLogger("lmiserve.engine")


class RequestRejected(ValueError):
    """The engine cannot take this request (the API layer should have refused it first)."""


class Engine:
    def __init__(self, config: EngineConfig, on_rank_failure: Callable[[str], None] | None = None):
        """``on_rank_failure``: called when a tensor-parallel rank dies while the engine runs
        (the engine process exits); without it, the next step raises :class:`TensorParallelError`."""
        started = time.monotonic()
        self.config = config
        loaded = start(config, on_rank_failure)
        self._loaded = loaded
        self.spec, self.max_model_len, self.eos_token_ids = loaded.spec, loaded.max_model_len, loaded.eos_token_ids
        self.runner, self.lora, self.guided, self.ranks = loaded.runner, loaded.lora, loaded.guided, loaded.ranks
        self.sampler = loaded.sampler
        self.blocks = BlockManager(loaded.num_blocks, config.block_size, config.enable_prefix_caching)
        limits = SchedulerConfig(
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self.max_model_len,
            config.max_prefill_seqs,
            config.max_decode_step_prefill_tokens,
            config.decode_step_prefill_tokens_per_sequence,
            config.measured_prompt_share,
        )
        self.scheduler = Scheduler(limits, self.blocks, self.lora.book)
        self.beams = BeamSearch(self.scheduler, self.blocks, self.eos_token_ids, self.max_model_len)
        self.outputs = OutputBuilder(self.eos_token_ids, self.max_model_len)
        self.groups: dict[str, Group] = {}
        self.prompt_tokens = self.generated_tokens = 0
        self.last_step_seconds = self._step_started = 0.0
        self._batch_size = 0
        self.faults = faults.FaultCounts()
        self.speeds = StepSpeeds()
        for batch, seconds in loaded.decode_seed:
            self.speeds.seed(batch, seconds)
        self._notices: list[wire.SeqDelta] = []
        """Deltas of sequences that ended while a step was scheduled (deadlines), for its output."""
        self.overlap = (
            OverlappedSteps(self)
            if overlap_enabled(config.async_scheduling, config.device, self.ranks is not None)
            else None
        )
        """Set when steps overlap (``option.async_scheduling``): the next step is launched before
        this one's tokens are read back (:mod:`.overlap`)."""
        self.info = describe(config, loaded, self.scheduler.max_num_batched_tokens, started)
        self.info["async_scheduling"] = "on" if self.overlap is not None else "off"
        self._compiles_at_ready = self.runner.kernel_compiles()

    # --- requests -----------------------------------------------------------------------
    def submit(self, request: wire.GenerateRequest) -> None:
        """:meth:`add_request` with everything a request message carries."""
        self.add_request(
            request.request_id,
            request.prompt_ids,
            request.params,
            request.adapter,
            output_ids=request.output_ids,
            cumulative_logprob=request.cumulative_logprob,
            deadline=request.deadline,
        )

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: wire.SamplingParams,
        adapter: str = "",
        *,
        output_ids: list[int] | tuple[int, ...] = (),
        cumulative_logprob: float = 0.0,
        deadline: float = 0.0,
    ) -> None:
        """Queue a request. ``output_ids``: the tokens it already generated before the engine that
        ran it died (:mod:`..runner.replay`), with their ``cumulative_logprob``; ``deadline``: the
        ``time.monotonic()`` after which it is not started (0: none)."""
        if request_id in self.groups:
            raise RequestRejected(f"request id {request_id!r} is already running")
        if not prompt_ids:
            raise RequestRejected("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise RequestRejected(f"the prompt has {len(prompt_ids)} tokens; max_model_len is {self.max_model_len}")
        if max(prompt_ids) >= self.spec.vocab_size or min(prompt_ids) < 0:
            raise RequestRejected("the prompt holds token ids outside the vocabulary")
        if params.num_beams > 1 and params.n > params.num_beams:
            raise RequestRejected(f"n ({params.n}) must not exceed num_beams ({params.num_beams})")
        group = Group(request_id, params, deadline=deadline)
        try:
            if output_ids:
                replay.check(prompt_ids, output_ids, params, self.spec.vocab_size, self.max_model_len)
            if params.guided is not None:
                self.guided.check(params.guided)
        except ValueError as exc:
            raise RequestRejected(str(exc)) from None
        if params.num_beams > 1:
            BeamSearch.start(group, prompt_ids)
        else:
            for index in range(max(params.best_of, params.n, 1)):
                group.sequences.append(Sequence(group, index, list(prompt_ids), len(prompt_ids)))
        if output_ids:
            seq = group.leader
            seq.token_ids.extend(output_ids)
            seq.num_replayed = len(output_ids)
            seq.cumulative_logprob = cumulative_logprob
        try:
            if output_ids and params.guided is not None:
                self.guided.start(group.leader)  # its grammar state past the replayed tokens
            if adapter:
                group.adapter = self.lora.use(adapter)
        except ValueError as exc:
            self.guided.forget(group.leader)
            raise RequestRejected(str(exc)) from None
        self.groups[request_id] = group
        self.scheduler.add(group)

    def abort(self, request_id: str, index: int | None = None) -> None:
        """Stop a request (or one of its sequences); its blocks are free for the next step."""
        group = self.groups.get(request_id)
        if group is None:
            return
        for seq in group.sequences:
            if index is None or seq.index == index:
                self._finish(seq, "abort")

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any (a single-process engine holds nothing)."""
        self._loaded.close()

    def has_work(self) -> bool:
        return self.scheduler.has_work() or (self.overlap is not None and self.overlap.has_results())

    def adapter_command(self, cmd: wire.AdapterCommand) -> wire.AdapterResult:
        return self.lora.adapter_command(cmd)

    # --- one step -------------------------------------------------------------------------
    def step(self) -> list[wire.SeqDelta]:
        """One step: schedule, run, update (overlapped: the update is the previous step's)."""
        if self.overlap is not None:
            deltas = self.overlap.step()
        else:
            batch = self.schedule()
            deltas = self.run_serial(batch) if batch else []
        if self._notices:
            deltas, self._notices = self._notices + deltas, []
        return deltas

    def run_serial(self, batch: SchedulerOutput) -> list[wire.SeqDelta]:
        """Run and update a scheduled batch; a failing batch is retried in halves, one that ran
        out of memory in the next step without the sequence that asked the most of it."""
        try:
            deltas = self.update(batch, self.runner.run(batch))
        except TensorParallelError:
            raise  # the ranks are out of step: nothing can be retried
        except Exception as exc:  # noqa: BLE001 - isolate the request(s) at fault
            if faults.out_of_memory(exc):
                deltas = self.out_of_memory(batch, exc)
            else:
                deltas = self._retry_in_halves(batch, exc)
        self._step_done(batch)
        return deltas

    def schedule(self) -> SchedulerOutput:
        """The next batch, with the adapters it needs in their device slots."""
        started = time.monotonic()
        batch = self.scheduler.schedule()
        for seq in batch.expired:
            self.faults.expired += 1
            self._finish(seq, "error")
            self._notices.append(error_delta(seq, "the request's deadline passed before it was started", "deadline"))
        if not batch:
            return batch
        if self.ranks is not None:
            self.ranks.check()
        self._step_started, self._batch_size = started, len(batch.scheduled)
        for item in batch.scheduled:
            if item.seq.first_scheduled is None:
                item.seq.first_scheduled = started
        self.lora.fill_slots()
        return batch

    def update(self, batch: SchedulerOutput, result: StepResult) -> list[wire.SeqDelta]:
        """The step's tokens into their sequences, a delta for each, and finished sequences freed."""
        self.scheduler.after_step(batch)
        self.prompt_tokens += batch.num_prompt_tokens
        for seq, (values, top) in result.prompt_logprobs.items():
            seq.prompt_logprobs.extend(values)
            seq.prompt_top_logprobs.extend(top)
        deltas: list[wire.SeqDelta] = []
        for group, logprobs in result.beams.items():
            deltas += self.beams.step(group, logprobs, self._batch_size)
            self.generated_tokens += len(group.beam.running)
            self._maybe_done(group)
        if result.samples is not None:
            deltas += self.record(result.seqs, result.samples, self._batch_size, self._step_started)
        return deltas

    def record(
        self, seqs: list[Sequence], samples: SampleResult, batch_size: int, step_started: float
    ) -> list[wire.SeqDelta]:
        """Each sequence's sampled token appended, a delta for each, and the finished ones freed."""
        deltas: list[wire.SeqDelta] = []
        for i, seq in enumerate(seqs):
            token, logprob = samples.token_ids[i], samples.logprobs[i]
            if not finite(logprob):
                deltas.append(self._nonfinite(seq))
                continue
            seq.token_ids.append(token)
            self.guided.accept(seq, token)
            seq.cumulative_logprob += logprob
            top = samples.top[i] if samples.top is not None else None
            delta = self.outputs.token(seq, token, logprob, top, batch_size, step_started)
            if delta.finish_reason is not None:
                self._finish(seq, delta.finish_reason)
            deltas.append(delta)
        self.generated_tokens += len(seqs)
        return deltas

    @property
    def step_started(self) -> float:
        """When the last batch was scheduled."""
        return self._step_started

    @property
    def batch_size(self) -> int:
        """Sequences in the last batch scheduled."""
        return self._batch_size

    def finish(self, seq: Sequence, reason: str) -> None:
        """End ``seq`` (its blocks are free for the next step)."""
        self._finish(seq, reason)

    def _nonfinite(self, seq: Sequence) -> wire.SeqDelta:
        """End ``seq``, whose logits held NaN or inf (the others in its step go on)."""
        log.warning("request %s: the model's logits are not finite; the sequence ends", seq.request_id)
        self.faults.nonfinite += 1
        self._finish(seq, "error")
        return error_delta(seq, "the model gave NaN or infinite logits for this sequence", "nonfinite")

    def out_of_memory(self, batch: SchedulerOutput, exc: Exception) -> list[wire.SeqDelta]:
        """Memory ran out in ``batch``: it is undone, its largest sequence ends, the rest wait for
        the next step (:mod:`.faults`)."""
        faults.roll_back(batch, self.blocks)
        faults.release_cached_memory()
        seq = faults.oom_victim(batch)
        log.warning("out of memory in a step of %d sequences; request %s ends", len(batch.scheduled), seq.request_id)
        self.faults.oom += 1
        self._finish(seq, "error")
        return [error_delta(seq, f"out of memory in the engine's step: {exc}", "oom")]

    def _retry_in_halves(self, batch: SchedulerOutput, exc: Exception) -> list[wire.SeqDelta]:
        """A failed batch again, split until the failing sequences are found; only those end."""
        items = batch.scheduled
        if len(items) == 1:
            seq = items[0].seq
            log.exception("request %s failed", seq.request_id)
            self._finish(seq, "error")
            return [error_delta(seq, f"{type(exc).__name__}: {exc}")]
        log.warning("a batch of %d sequences failed (%s); retrying them in halves", len(items), exc)
        deltas: list[wire.SeqDelta] = []
        half = len(items) // 2
        for part in (items[:half], items[half:]):
            live = SchedulerOutput.of([i for i in part if not i.seq.finished])
            if not live:
                continue
            try:
                deltas += self.update(live, self.runner.run(live))
            except TensorParallelError:
                raise
            except Exception as inner:  # noqa: BLE001
                deltas += self._retry_in_halves(live, inner)
        return deltas

    def _step_done(self, batch: SchedulerOutput) -> None:
        ended = time.monotonic()
        for item in batch.scheduled:
            if item.samples:
                item.seq.ready_since = ended
        self.step_timed(batch, ended - self._step_started)

    def step_timed(self, batch: SchedulerOutput, seconds: float) -> None:
        """Record that ``batch`` took ``seconds`` (from its scheduling to its tokens on the host)."""
        self.last_step_seconds = seconds
        self.speeds.record(sum(item.num_tokens for item in batch.prefills), seconds, len(batch.decodes))

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)
        self.sampler.forget(seq)
        self._maybe_done(seq.group)

    def _maybe_done(self, group: Group) -> None:
        if all(s.finished for s in group.sequences) and self.groups.pop(group.request_id, None) is not None:
            self.lora.done(group)

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
            graph_steps=self.runner.graph_steps,
            eager_steps=self.runner.eager_steps,
            kernel_compiles=self.runner.kernel_compiles() - self._compiles_at_ready,
            expired_in_queue=self.faults.expired,
            oom_failures=self.faults.oom,
            nonfinite_sequences=self.faults.nonfinite,
            prefill_tokens_per_s=self.speeds.prefill_tokens_per_s,
            decode_step_seconds=self.speeds.decode_step_seconds,
            idle_prefill_tokens_per_s=self.speeds.idle_prefill_tokens_per_s,
            decode_step_prefill_tokens=self.scheduler.decode_step_prefill_budget(),
            decode_curve=self.speeds.decode_curve(),
            **self.lora.stats(),
        )
