"""A scheduled step: which sequences run, how many tokens each, and what the step must do first.

Plain Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sequence import Sequence


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int
    start: int = 0
    """Position of the first token run this step."""
    samples: bool = False
    """Whether this step reaches the end of the sequence, so a token is sampled."""
    decode: bool = False
    draft: tuple[int, ...] = ()
    """Proposed tokens run after the sequence's last token (a verify run: speculative decoding)."""

    @classmethod
    def of(cls, seq: Sequence, num_tokens: int, decode: bool = False) -> ScheduledSeq:
        return cls(seq, num_tokens, seq.num_computed, seq.num_computed + num_tokens == seq.num_tokens, decode)


@dataclass
class SchedulerOutput:
    decodes: list[ScheduledSeq] = field(default_factory=list)
    prefills: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    """KV blocks to copy (source, destination) before the step runs (copy-on-write)."""
    expired: list[Sequence] = field(default_factory=list)
    """Waiting sequences whose request's deadline passed: finished, never scheduled."""
    verifies: list[ScheduledSeq] = field(default_factory=list)
    """Decoding sequences that run their last token and proposed tokens (``draft``) as one causal
    run (each row attended as the decode of its position); each proposed token's row gives a token too."""

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        return self.decodes + self.prefills + self.verifies

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(s.num_tokens for s in self.prefills + self.verifies)

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt tokens computed in this step (a chunk that ends a prompt may run past it)."""
        return sum(min(i.num_tokens, max(0, i.seq.num_prompt_tokens - i.start)) for i in self.prefills)

    @classmethod
    def of(cls, items: list[ScheduledSeq]) -> SchedulerOutput:
        return cls(
            decodes=[i for i in items if i.decode],
            prefills=[i for i in items if not i.decode and not i.draft],
            verifies=[i for i in items if i.draft],
        )

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills or self.verifies)
