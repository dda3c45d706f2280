"""Overlapped steps: the next step is scheduled and launched while the device still runs this one.

A serial step waits for its sampled tokens on the host before it schedules the next, so the host's
work (reading the tokens back, scheduling, building the step's arrays, the deltas) and the device's
work take turns. Here each :meth:`OverlappedSteps.step` does, with step N in flight:

1. schedule step N+1. Every sequence that samples in step N already holds a placeholder for its
   token (:data:`PLACEHOLDER`) and counts N's tokens as computed, so it decodes in N+1 and its
   blocks are allocated for the token N adds;
2. launch step N+1: its placeholder input ids are filled on the device from N's sampled tokens
   (:class:`~..runner.step_inputs.TokenFill`), and its own tokens are sampled there and copied to pinned
   host memory without waiting (an event marks the copy's end);
3. collect step N: wait for that event (the one wait of a step, behind which N+1 is already
   queued), put N's tokens in place of the placeholders and build the deltas. A sequence that ends
   at N (end of sequence, stop token, length, abort) and already runs in N+1 is finished now: its
   blocks are freed at once, which is safe because any later step is queued behind N+1 on the
   device (its KV writes in N+1 went to its own blocks), and its N+1 token is dropped, without a
   delta, when N+1 is collected;
4. record N+1 as computed and give its sampling sequences their placeholders. The blocks N+1
   fills are registered for prefix caching now, before the device has written them: a step that
   reuses them is queued behind N+1.

A sequence is sampled once per step as in serial mode, so seeded generators advance alike and the
tokens are those of the serial engine; only a finished sequence's extra draw is thrown away.

On the CPU, torch runs every op at once, so the launch computes the step and the collect only
reads it back: the data flow is the same, the time is not overlapped.

Run serially, after collecting the step in flight: steps with verify runs (which tokens they
keep decides the next step's inputs; a step in flight whose sequences may propose tokens is
collected before the next is scheduled, so that they can), steps with a beam search (and the block copies
its forks make), guided decoding (its grammar needs the token on the host before the next mask),
prompt log-probabilities, repetition, presence or frequency penalties, min_new_tokens and bad words (they
read the sequence's tokens, or its count of them, on the host), and a step whose launch fails (it
is retried in halves, as a serial step is; one that ran out of memory is undone instead, as a serial
step is, see :mod:`.faults`). A tensor-parallel engine runs serially throughout.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ... import wire
from ..runner.parallel import TensorParallelError
from ..runner.sampler import DeviceSamples, SampleResult
from ..runner.step_inputs import TokenFill, device_tensor
from ..scheduling.scheduler import SchedulerOutput
from ..scheduling.sequence import Sequence
from .faults import out_of_memory
from .outputs import error_delta
from .overlap_seam import OverlapSeam

log = logging.getLogger("lmiserve.engine")

PLACEHOLDER = -1
"""The host's stand-in for a token sampled on the device and not read back yet."""


def overlap_enabled(setting: str, device: str, tensor_parallel: bool) -> bool:
    """Whether an engine overlaps its steps: ``option.async_scheduling`` (auto: on CUDA devices)."""
    if tensor_parallel:
        return False
    if setting == "auto":
        return device.startswith("cuda")
    return setting == "true"


def overlappable(batch: SchedulerOutput) -> bool:
    """Whether ``batch`` can run while the host does not know its predecessor's tokens."""
    if batch.copies or batch.verifies:
        return False
    for item in batch.scheduled:
        seq = item.seq
        p = seq.params
        if seq.group.beam is not None or p.guided is not None or p.prompt_logprobs is not None:
            return False
        if p.min_new_tokens or p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
            return False
        if p.bad_word_ids:
            return False
    return True


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read yet."""

    batch: SchedulerOutput
    seqs: list[Sequence]
    """The sequences that sample, in the order of the samples' rows."""
    samples: DeviceSamples | None
    started: float
    batch_size: int
    host: torch.Tensor | None = None
    """Where ``samples.packed`` is being copied (pinned memory on CUDA)."""
    ready: Any = None
    """An event recorded after that copy, or None where the copy was synchronous."""
    rows: dict[int, int] = field(default_factory=dict)
    """seq_id -> row of ``samples.tokens``."""

    def read(self) -> list[float]:
        assert self.host is not None
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


def _start_copy(packed: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """Begin bringing ``packed`` to the host; the destination and an event marking the end."""
    if packed.device.type == "cuda":
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return host, ready
    return packed, None  # on the CPU it is there already; other devices are read when collected


class OverlappedSteps:
    """Steps an engine with one step in flight (see the module's description)."""

    def __init__(self, phases: OverlapSeam):
        self.phases = phases
        """The engine's step phases (:class:`~.step_phases.StepPhases`), as this module uses them."""
        self.pending: InFlight | None = None
        self.overlapped = 0
        """Steps launched before their predecessor's tokens were read back."""
        self.serial = 0
        """Steps run serially (the module's description says which)."""

    def has_results(self) -> bool:
        """Whether the step in flight has tokens some running sequence still waits for."""
        return self.pending is not None and any(not s.finished for s in self.pending.seqs)

    def step(self) -> list[wire.SeqDelta]:
        phases = self.phases
        if self.pending is not None and phases.would_propose(self.pending.seqs):
            # its sequences propose once their tokens are on the host: collect first, then schedule
            early = self.collect()
            return early + self._step()
        return self._step()

    def _step(self) -> list[wire.SeqDelta]:
        phases = self.phases
        batch = phases.schedule()
        if batch and overlappable(batch):
            launched, error = self._launch(batch)
            if launched is not None:
                self.overlapped += 1
                deltas = self.collect()
                self._advance(launched)
                return deltas
            if error is not None and out_of_memory(error):
                deltas = self.collect()
                live = SchedulerOutput.of([i for i in batch.scheduled if not i.seq.finished])
                return deltas + (phases.out_of_memory(live, error) if live else [])
        deltas = self.collect()
        if batch:
            # sequences that ended in the step just collected leave the batch
            decodes = [i for i in batch.decodes if not i.seq.finished]
            prefills = [i for i in batch.prefills if not i.seq.finished]
            verifies = [i for i in batch.verifies if not i.seq.finished]
            live = SchedulerOutput(decodes=decodes, prefills=prefills, copies=batch.copies, verifies=verifies)
            if live:
                self.serial += 1
                deltas += phases.run_serial(live)
        return deltas

    # --- the halves -------------------------------------------------------------------------
    def _launch(self, batch: SchedulerOutput) -> tuple[InFlight | None, Exception | None]:
        """Run ``batch`` on the device, its tokens staying there; else why it failed (it then runs
        serially, which finds the sequences at fault, unless memory ran out)."""
        phases = self.phases
        seqs = [item.seq for item in batch.decodes + batch.prefills if item.samples]
        try:
            samples = phases.runner.launch(batch, self._fill(batch))
        except TensorParallelError:
            raise
        except Exception as exc:  # noqa: BLE001 - the serial retry isolates the request(s) at fault
            log.debug("an overlapped step failed (%s)", exc)
            return None, exc
        flight = InFlight(batch, seqs, samples, phases.step_started, phases.batch_size)
        if samples is not None:
            flight.host, flight.ready = _start_copy(samples.packed)
            flight.rows = {seq.seq_id: row for row, seq in enumerate(seqs)}
        return flight, None

    def _fill(self, batch: SchedulerOutput) -> TokenFill | None:
        """Where ``batch`` takes input ids from the step in flight's samples."""
        pending = self.pending
        if pending is None or pending.samples is None:
            return None
        positions: list[int] = []
        rows: list[int] = []
        offset = 0
        for item in batch.decodes + batch.prefills:
            seq = item.seq
            offset += item.num_tokens
            if item.start + item.num_tokens == seq.num_tokens and seq.token_ids[-1] == PLACEHOLDER:
                positions.append(offset - 1)
                rows.append(pending.rows[seq.seq_id])
        if not positions:
            return None
        source = pending.samples.tokens
        both = device_tensor(positions + rows, torch.long, source.device)
        return TokenFill(both[: len(positions)], source, both[len(positions) :])

    def _advance(self, flight: InFlight) -> None:
        """Record the launched step as computed and give its sampling sequences placeholders."""
        live = SchedulerOutput.of([i for i in flight.batch.scheduled if not i.seq.finished])
        self.phases.computed(live, flight.batch)
        for seq in flight.seqs:
            if not seq.finished:
                seq.token_ids.append(PLACEHOLDER)
        self.pending = flight

    def collect(self) -> list[wire.SeqDelta]:
        """The step in flight's tokens into their sequences, and their deltas (none in flight: none)."""
        flight, self.pending = self.pending, None
        if flight is None:
            return []
        deltas: list[wire.SeqDelta] = []
        keep = [i for i, seq in enumerate(flight.seqs) if not seq.finished]
        if flight.samples is not None and keep:  # all ended: nothing to read back
            seqs = [flight.seqs[i] for i in keep]
            for seq in seqs:
                seq.token_ids.pop()  # the placeholder
            try:
                found = flight.samples.on_host(flight.read(), flight.seqs)
            except Exception as exc:  # noqa: BLE001 - the step failed on the device
                log.exception("an overlapped step failed")
                for seq in seqs:
                    self.phases.finish(seq, "error")
                return [error_delta(seq, f"{type(exc).__name__}: {exc}") for seq in seqs]
            top = None if found.top is None else [found.top[i] for i in keep]
            kept = SampleResult([found.token_ids[i] for i in keep], [found.logprobs[i] for i in keep], top)
            deltas = self.phases.record(seqs, kept, flight.batch_size, flight.started)
        ended = time.monotonic()
        for item in flight.batch.scheduled:
            if item.samples:
                item.seq.ready_since = ended
        if keep:
            # a step whose sequences had all ended is collected only with the next work, however
            # long the engine then stood idle: that wait is no step's time
            self.phases.step_timed(flight.batch, ended - flight.started)
        return deltas
