"""The continuous-batching engine: requests in, token ids out, one step at a time.

Each :meth:`Engine.step` schedules a batch (new requests join, long prompts are chunked,
running sequences decode), runs it (the model once over every scheduled token, then
sampling), and updates the sequences with what it produced, reporting per sequence a delta.
The engine knows token ids only: text, stop strings and response formats live above it.
Requests are admitted by :mod:`.admission`, a step's phases are :mod:`.step_phases`' (run
serially, or overlapped by :mod:`.overlap`); start-up (weights, KV cache, graphs) is
:mod:`..runner.startup`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ... import wire
from ..engine_config import EngineConfig
from ..runner.startup import describe, start
from ..scheduling.block_manager import BlockManager
from ..scheduling.scheduler import Scheduler, SchedulerConfig
from ..scheduling.sequence import Group
from .admission import Admission, RequestRejected
from .overlap import OverlappedSteps, overlap_enabled
from .speculation_setup import build_speculation
from .step_phases import StepPhases


class Engine:
    def __init__(self, config: EngineConfig, on_rank_failure: Callable[[str], None] | None = None):
        """``on_rank_failure``: called when a tensor-parallel rank dies while the engine runs
        (the engine process exits); without it, the next step raises :class:`~..runner.parallel.TensorParallelError`."""
        started = time.monotonic()
        self.config = config
        loaded = start(config, on_rank_failure)
        self._loaded = loaded
        loaded.speculation = build_speculation(config, loaded)
        self.spec, self.max_model_len, self.eos_token_ids = loaded.spec, loaded.max_model_len, loaded.eos_token_ids
        self.runner, self.lora, self.guided, self.ranks = loaded.runner, loaded.lora, loaded.guided, loaded.ranks
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
        self.groups: dict[str, Group] = {}
        self._admission = Admission(
            self.spec.vocab_size, self.max_model_len, self.guided, self.lora, self.runner.images
        )
        self._phases = StepPhases(loaded, self.scheduler, self.blocks, self.groups)
        self.outputs = self._phases.outputs
        self.overlap = (
            OverlappedSteps(self._phases)
            if overlap_enabled(config.async_scheduling, config.device, self.ranks is not None)
            else None
        )
        """Set when steps overlap (``option.async_scheduling``): the next step is launched before
        this one's tokens are read back (:mod:`.overlap`)."""
        self.info = describe(config, loaded, self.scheduler.max_num_batched_tokens, started)
        self.info["async_scheduling"] = "on" if self.overlap is not None else "off"
        if loaded.speculation is not None:
            self.info.update(loaded.speculation.info())
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
            images=request.images,
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
        images: list[wire.ImageInput] | tuple[wire.ImageInput, ...] = (),
    ) -> None:
        """Queue a request. ``output_ids``: the tokens it already generated before the engine that
        ran it died (:mod:`..runner.replay`), with their ``cumulative_logprob``; ``deadline``: the
        ``time.monotonic()`` after which it is not started (0: none)."""
        if request_id in self.groups:
            raise RequestRejected(f"request id {request_id!r} is already running")
        group = self._admission.group(
            request_id, prompt_ids, params, adapter, output_ids, cumulative_logprob, deadline, images
        )
        self.groups[request_id] = group
        self.scheduler.add(group)

    def abort(self, request_id: str, index: int | None = None) -> None:
        """Stop a request (or one of its sequences); its blocks are free for the next step."""
        group = self.groups.get(request_id)
        if group is None:
            return
        for seq in group.sequences:
            if index is None or seq.index == index:
                self._phases.finish(seq, "abort")

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
        phases = self._phases
        if self.overlap is not None:
            deltas = self.overlap.step()
        else:
            batch = phases.schedule()
            deltas = phases.run_serial(batch) if batch else []
        if phases.notices:
            deltas, phases.notices = phases.notices + deltas, []
        return deltas

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens computed so far."""
        return self._phases.prompt_tokens

    def stats(self) -> wire.EngineStats:
        phases = self._phases
        return wire.EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_used=self.blocks.num_used_blocks,
            kv_blocks_total=self.blocks.num_blocks,
            prefix_cache_hit_tokens=self.blocks.prefix_hit_tokens,
            preemptions=self.scheduler.num_preemptions,
            prompt_tokens=phases.prompt_tokens,
            generated_tokens=phases.generated_tokens,
            step_seconds=phases.last_step_seconds,
            graph_steps=self.runner.graph_steps,
            eager_steps=self.runner.eager_steps,
            kernel_compiles=self.runner.kernel_compiles() - self._compiles_at_ready,
            expired_in_queue=phases.faults.expired,
            oom_failures=phases.faults.oom,
            nonfinite_sequences=phases.faults.nonfinite,
            prefill_tokens_per_s=phases.speeds.prefill_tokens_per_s,
            decode_step_seconds=phases.speeds.decode_step_seconds,
            idle_prefill_tokens_per_s=phases.speeds.idle_prefill_tokens_per_s,
            decode_step_prefill_tokens=self.scheduler.decode_step_prefill_budget(),
            decode_curve=phases.speeds.decode_curve(),
            **self.lora.stats(),
            **(phases.speculation.stats() if phases.speculation is not None else {}),
        )
