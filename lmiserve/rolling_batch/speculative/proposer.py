"""What every proposer of speculative tokens offers the engine.

Before a step is scheduled, the engine asks its proposer for tokens that continue each decoding
sequence (:meth:`Proposer.propose`); the step runs each sequence's last token and its proposals as
one causal run, keeps the longest prefix the model agrees with plus the model's own next token, and
forgets the rest (:mod:`..runner.verify`). A proposer that reads the target model's hidden states
(EAGLE) is handed, after every step, those of the tokens that became final
(:meth:`Proposer.observe`).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..scheduling.sequence import Sequence


class Proposer(Protocol):
    name: str
    """``ngram``, ``draft_model``, ``eagle`` or ``eagle3``."""
    cost_ratio: float
    """What proposing one token costs, as a share of a step of the target model at one sequence
    (0 for a proposer without weights): the cost model's ``c`` (:mod:`.adaptive`)."""
    hidden: str
    """Which hidden states of the target the proposer reads: ``""`` (none), ``final`` (after the
    final norm, one row of ``hidden_size`` per token) or ``aux`` (the layers the proposer names in
    :attr:`aux_layers`, concatenated, before any norm)."""
    aux_layers: tuple[int, ...]

    def propose(self, seqs: list[Sequence], counts: list[int]) -> list[list[int]]:
        """At most ``counts[i]`` tokens continuing ``seqs[i].token_ids`` (all known on the host,
        the last one not yet run through the model), for every ``i``; an empty list proposes none."""
        ...

    def observe(self, seq: Sequence, start: int, hidden: Any) -> None:
        """The target's hidden states (a tensor of ``(rows, width)``) of ``seq``'s tokens at
        positions ``start``, ``start + 1``, ...: final now (called only when :attr:`hidden` is set)."""
        ...

    def forget(self, seq: Sequence) -> None:
        """``seq`` ended or was preempted: drop what is kept for it."""
        ...
