"""A step's phases, the serial steps' and the overlapped steps' alike: schedule a batch
(:meth:`StepPhases.schedule`), run it and update its sequences with the tokens
(:meth:`StepPhases.run_serial`), or record tokens read back later (:meth:`StepPhases.record`,
from :mod:`.overlap`, which reaches the phases through :class:`.overlap_seam.OverlapSeam`), and end
sequences. The counts and speeds the engine's stats report are kept here, as the steps go.
"""

from __future__ import annotations

import time

from ... import wire
from ..runner.parallel import TensorParallelError
from ..runner.sampler import SampleResult, StepResult, finite
from ..runner.startup import Loaded
from ..runner.verify import Checked
from ..scheduling.block_manager import BlockManager
from ..scheduling.scheduler import Scheduler, SchedulerOutput
from ..scheduling.sequence import Group, Sequence
from . import faults
from .beam_search import BeamSearch
from .outputs import OutputBuilder, error_delta
from .speeds import StepSpeeds


class StepPhases:
    def __init__(self, loaded: Loaded, scheduler: Scheduler, blocks: BlockManager, groups: dict[str, Group]):
        """``groups``: the engine's running requests, by id (a request leaves once all its
        sequences finished)."""
        self.runner, self.sampler, self.guided = loaded.runner, loaded.sampler, loaded.guided
        self.lora, self.ranks = loaded.lora, loaded.ranks
        self.scheduler, self.blocks, self.groups = scheduler, blocks, groups
        self.beams = BeamSearch(scheduler, blocks, loaded.eos_token_ids, loaded.max_model_len)
        self.outputs = OutputBuilder(loaded.eos_token_ids, loaded.max_model_len)
        self.prompt_tokens = self.generated_tokens = 0
        self.last_step_seconds = 0.0
        self.step_started = 0.0
        """When the last batch was scheduled."""
        self.batch_size = 0
        """Sequences in the last batch scheduled."""
        self.faults = faults.FaultCounts()
        self.speeds = StepSpeeds()
        for batch, seconds in loaded.decode_seed:
            self.speeds.seed(batch, seconds)
        self.notices: list[wire.SeqDelta] = []
        """Deltas of sequences that ended while a step was scheduled (deadlines), for its output."""
        self.speculation = loaded.speculation
        """Speculative decoding (:mod:`.speculation`), when configured."""

    def schedule(self) -> SchedulerOutput:
        """The next batch, with the adapters it needs in their device slots."""
        started = time.monotonic()
        if self.speculation is not None:
            self.speculation.prepare(self.scheduler.running, self.speeds.decode_curve())
        batch = self.scheduler.schedule()
        for seq in batch.expired:
            self.faults.expired += 1
            self.finish(seq, "error")
            self.notices.append(error_delta(seq, "the request's deadline passed before it was started", "deadline"))
        if not batch:
            return batch
        if self.ranks is not None:
            self.ranks.check()
        self.step_started, self.batch_size = started, len(batch.scheduled)
        for item in batch.scheduled:
            if item.seq.first_scheduled is None:
                item.seq.first_scheduled = started
        self.lora.fill_slots()
        return batch

    def would_propose(self, seqs: list[Sequence]) -> bool:
        """Whether one of ``seqs`` would propose tokens once its last token is on the host."""
        return self.speculation is not None and self.speculation.would_propose(seqs)

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
                deltas = faults.retry_in_halves(batch, exc, self._run, self.finish)
        self._step_done(batch)
        return deltas

    def _run(self, batch: SchedulerOutput) -> list[wire.SeqDelta]:
        """Run and update ``batch`` (a part of a failed one, :func:`.faults.retry_in_halves`)."""
        return self.update(batch, self.runner.run(batch))

    def out_of_memory(self, batch: SchedulerOutput, exc: Exception) -> list[wire.SeqDelta]:
        """Memory ran out in ``batch``: it is undone, its largest sequence ends, the rest wait for
        the next step (:mod:`.faults`)."""
        return faults.undo_out_of_memory(batch, exc, self.blocks, self.faults, self.finish)

    def update(self, batch: SchedulerOutput, result: StepResult) -> list[wire.SeqDelta]:
        """The step's tokens into their sequences, a delta for each, and finished sequences freed."""
        self.computed(batch)
        for seq, (values, top) in result.prompt_logprobs.items():
            seq.prompt_logprobs.extend(values)
            seq.prompt_top_logprobs.extend(top)
        deltas: list[wire.SeqDelta] = []
        for group, logprobs in result.beams.items():
            deltas += self.beams.step(group, logprobs, self.batch_size)
            self.generated_tokens += len(group.beam.running)
            self._maybe_done(group)
        if result.samples is not None:
            deltas += self.record(result.seqs, result.samples, self.batch_size, self.step_started)
        rows = self._verify_rows(batch)
        for checked in result.verified:
            deltas += self.record_checked(checked, rows.get(checked.seq.seq_id, -1))
        return deltas

    def _verify_rows(self, batch: SchedulerOutput) -> dict[int, int]:
        """Where each verify run's rows start in the step's hidden states (for a proposer that reads them)."""
        if self.speculation is None or not self.speculation.proposer.hidden:
            return {}
        row = len(batch.decodes)  # a verify run's rows follow the decodes'
        found = {}
        for item in batch.verifies:
            found[item.seq.seq_id] = row
            row += item.num_tokens
        return found

    def _observe(self, batch: SchedulerOutput) -> None:
        """Hand a proposer that reads the model's hidden states those of the decodes' and prompt
        chunks' tokens, final once the step ran."""
        spec = self.speculation
        if spec is None or not spec.proposer.hidden:
            return
        hidden = self.runner.step_hidden(spec.proposer.hidden)
        row = 0
        for item in batch.decodes + batch.verifies + batch.prefills:
            if not item.seq.finished and not item.draft:
                spec.observe(item.seq, item.start, hidden[row : row + item.num_tokens])
            row += item.num_tokens

    def record_checked(self, checked: Checked, row: int = -1) -> list[wire.SeqDelta]:
        """A verify run's kept tokens appended, a delta for each (as steps merged for a slow reader
        arrive), up to the first that ends the sequence; the cache then holds all but the newest."""
        seq, deltas = checked.seq, []
        for j, token in enumerate(checked.tokens):
            if not finite(checked.logprobs[j]):
                deltas.append(faults.end_nonfinite(seq, self.faults, self.finish))
                break
            seq.token_ids.append(token)
            self.guided.accept(seq, token)
            seq.cumulative_logprob += checked.logprobs[j]
            top = checked.top[j] if checked.top is not None else None
            delta = self.outputs.token(seq, token, checked.logprobs[j], top, self.batch_size, self.step_started)
            deltas.append(delta)
            self.generated_tokens += 1
            if delta.finish_reason is not None:
                self.finish(seq, delta.finish_reason)
                break
        assert self.speculation is not None
        self.speculation.checked(checked)
        if not seq.finished:
            start = seq.num_computed - 1  # the verify run's first position
            self.scheduler.accepted(seq)
            if row >= 0:  # the last token's and the kept proposals' hidden states
                hidden = self.runner.step_hidden(self.speculation.proposer.hidden)
                self.speculation.observe(seq, start, hidden[row : row + seq.num_computed - start])
        return deltas

    def computed(self, batch: SchedulerOutput, ran: SchedulerOutput | None = None) -> None:
        """Record that ``batch``'s tokens are in the cache (``ran``: the step as it ran, the layout of
        its hidden states, where some of its sequences ended since)."""
        self._observe(ran or batch)
        self.scheduler.after_step(batch)
        self.prompt_tokens += batch.num_prompt_tokens

    def record(
        self, seqs: list[Sequence], samples: SampleResult, batch_size: int, step_started: float
    ) -> list[wire.SeqDelta]:
        """Each sequence's sampled token appended, a delta for each, and the finished ones freed."""
        deltas: list[wire.SeqDelta] = []
        for i, seq in enumerate(seqs):
            token, logprob = samples.token_ids[i], samples.logprobs[i]
            if not finite(logprob):
                deltas.append(faults.end_nonfinite(seq, self.faults, self.finish))
                continue
            seq.token_ids.append(token)
            self.guided.accept(seq, token)
            seq.cumulative_logprob += logprob
            top = samples.top[i] if samples.top is not None else None
            delta = self.outputs.token(seq, token, logprob, top, batch_size, step_started)
            if delta.finish_reason is not None:
                self.finish(seq, delta.finish_reason)
            deltas.append(delta)
        self.generated_tokens += len(seqs)
        return deltas

    def finish(self, seq: Sequence, reason: str) -> None:
        """End ``seq`` (its blocks are free for the next step)."""
        self.scheduler.finish(seq, reason)
        self.sampler.forget(seq)
        if self.speculation is not None:
            self.speculation.forget(seq)
        self._maybe_done(seq.group)

    def _maybe_done(self, group: Group) -> None:
        if all(s.finished for s in group.sequences) and self.groups.pop(group.request_id, None) is not None:
            self.lora.done(group)

    def _step_done(self, batch: SchedulerOutput) -> None:
        ended = time.monotonic()
        for item in batch.scheduled:
            if item.samples:
                item.seq.ready_since = ended
        self.step_timed(batch, ended - self.step_started)

    def step_timed(self, batch: SchedulerOutput, seconds: float) -> None:
        """Record that ``batch`` took ``seconds`` (from its scheduling to its tokens on the host)."""
        self.last_step_seconds = seconds
        rows = len(batch.decodes) + sum(item.num_tokens for item in batch.verifies)
        prompt = sum(item.num_tokens for item in batch.prefills)
        self.speeds.record(prompt, seconds, rows)
        if self.speculation is not None:
            self.speculation.step_took(rows + prompt, seconds)
