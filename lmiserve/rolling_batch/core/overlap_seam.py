"""The seam between the engine and its overlapped steps: what :class:`~.overlap.OverlappedSteps`
takes from the engine's step phases (:class:`~.step_phases.StepPhases` satisfies it), and nothing
more. The overlapped steps schedule through it, launch on its runner, fall back on its serial run,
and hand it back the tokens they read."""

from __future__ import annotations

from typing import Protocol

from ... import wire
from ..runner.sampler import DeviceSamples, SampleResult
from ..runner.step_inputs import TokenFill
from ..scheduling.scheduler import SchedulerOutput
from ..scheduling.sequence import Sequence


class Launcher(Protocol):
    """The runner, as the overlapped steps use it."""

    def launch(self, out: SchedulerOutput, fill: TokenFill | None = None) -> DeviceSamples | None:
        """Run the step, its sampled tokens left on the device (:meth:`..runner.model_runner.ModelRunner.launch`)."""
        ...


class OverlapSeam(Protocol):
    """The engine's step phases, as the overlapped steps use them."""

    @property
    def runner(self) -> Launcher:
        """Where a step is launched."""
        ...

    @property
    def step_started(self) -> float:
        """When the last batch was scheduled."""
        ...

    @property
    def batch_size(self) -> int:
        """Sequences in the last batch scheduled."""
        ...

    def schedule(self) -> SchedulerOutput:
        """The next batch, stamped with :attr:`step_started` and :attr:`batch_size`."""
        ...

    def would_propose(self, seqs: list[Sequence]) -> bool:
        """Whether one of ``seqs`` would propose tokens once its last token is on the host."""
        ...

    def run_serial(self, batch: SchedulerOutput) -> list[wire.SeqDelta]:
        """Run and update ``batch`` as a serial step does (its failures isolated)."""
        ...

    def out_of_memory(self, batch: SchedulerOutput, exc: Exception) -> list[wire.SeqDelta]:
        """Undo ``batch``, in which memory ran out, and end its largest sequence."""
        ...

    def computed(self, batch: SchedulerOutput, ran: SchedulerOutput | None = None) -> None:
        """Record that ``batch``'s tokens are in the cache."""
        ...

    def record(
        self, seqs: list[Sequence], samples: SampleResult, batch_size: int, step_started: float
    ) -> list[wire.SeqDelta]:
        """Each sequence's sampled token appended, a delta for each, and the finished ones freed."""
        ...

    def finish(self, seq: Sequence, reason: str) -> None:
        """End ``seq`` (its blocks are free for the next step)."""
        ...

    def step_timed(self, batch: SchedulerOutput, seconds: float) -> None:
        """Record that ``batch`` took ``seconds`` (from its scheduling to its tokens on the host)."""
        ...
