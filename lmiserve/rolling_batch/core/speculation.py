"""Speculative decoding in the engine's steps: proposals before a step is scheduled, and what the
checks kept recorded after it.

Before each step, every running sequence that decodes gets the proposals its record pays for
(:mod:`..speculative.adaptive`) from the proposer, as ``Sequence.draft``; the scheduler turns a
sequence with proposals into a verify run (:meth:`..scheduling.scheduler.Scheduler._decode`). A
sequence proposes nothing when it searches beams, asked not to (``speculate: false``), is one
token from its end, or its last token is still on the device (an overlapped step). Proposals never
cross the token a constraint starts after: the grammar's first row is masked as a decode's would be.
"""

from __future__ import annotations

from typing import Any

from ...config.speculative import SpeculativeConfig
from ..runner.verify import Checked
from ..scheduling.sequence import Sequence
from ..speculative.adaptive import AdaptivePolicy, SeqRecord
from ..speculative.proposer import Proposer


class Speculation:
    def __init__(
        self,
        config: SpeculativeConfig,
        proposer: Proposer,
        max_model_len: int,
        table: tuple[tuple[int, float], ...] = (),
    ):
        """``table``: ``(rows, seconds)`` of decode steps timed at start-up (:mod:`..speculative.adaptive`)."""
        self.config = config
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.policy = AdaptivePolicy(config.num_speculative_tokens, config.adaptive, proposer.cost_ratio, table)
        self.proposed = self.accepted = self.drafts = 0

    def _room(self, seq: Sequence) -> int:
        """Most proposals ``seq`` can use: its model's token follows them within its limits."""
        p = seq.params
        if p.num_beams > 1 or not p.speculate or seq.group.beam is not None or seq.token_ids[-1] < 0:
            return 0
        left = min(p.max_new_tokens - seq.num_generated, self.max_model_len - seq.num_tokens) - 1
        return max(0, min(left, self.config.num_speculative_tokens))

    def would_propose(self, seqs: list[Sequence]) -> bool:
        """Whether one of ``seqs`` may propose in the next step (not paused, room left)."""
        for seq in seqs:
            record = seq.spec
            if seq.finished or (record is not None and record.pause and seq.num_generated + 1 < record.resume_at):
                continue
            p = seq.params
            if p.speculate and p.num_beams == 1 and seq.group.beam is None and p.max_new_tokens - seq.num_generated > 2:
                return True
        return False

    def prepare(self, running: list[Sequence], curve: list[tuple[float, float]]) -> None:
        """Set the proposals of the running sequences for the next step."""
        seqs, rooms = [], []
        for seq in running:
            seq.draft = []
            if seq.num_pending != 1 or seq.num_computed < seq.num_prompt_tokens:
                continue
            room = self._room(seq)
            if room:
                if seq.spec is None:
                    seq.spec = SeqRecord()
                seqs.append(seq)
                rooms.append(room)
        if not seqs:
            return
        self.policy.observe_curve(curve)
        counts = self.policy.counts([s.spec for s in seqs], [s.num_generated for s in seqs], len(running))
        asked = [(s, min(c, r)) for s, c, r in zip(seqs, counts, rooms) if min(c, r) > 0]
        if not asked:
            return
        found = self.proposer.propose([s for s, _ in asked], [c for _, c in asked])
        for (seq, count), draft in zip(asked, found):
            seq.draft = _before_constraint(seq, list(draft[:count]))

    def checked(self, result: Checked) -> None:
        """A verify run's result (its tokens already appended)."""
        seq = result.seq
        self.proposed += result.proposed
        self.accepted += len(result.tokens) - 1
        self.drafts += 1
        if seq.spec is not None:
            self.policy.update(seq.spec, result.proposed, len(result.tokens) - 1, seq.num_generated)
        seq.draft = []

    def step_took(self, rows: int, seconds: float) -> None:
        """A step of ``rows`` rows (prompt tokens included) took ``seconds`` (the cost model's input)."""
        self.policy.step_took(rows, seconds)

    def observe(self, seq: Sequence, start: int, hidden: Any) -> None:
        """Hidden states of ``seq``'s tokens from ``start`` on (copied: a captured graph's output is
        written again by its next replay)."""
        self.proposer.observe(seq, start, hidden.clone())

    def forget(self, seq: Sequence) -> None:
        seq.draft = []
        self.proposer.forget(seq)

    def info(self) -> dict[str, Any]:
        """What ``GET /models`` shows of it."""
        cfg = self.config
        return {
            "speculative": cfg.method,
            "num_speculative_tokens": cfg.num_speculative_tokens,
            "spec_adaptive": "on" if cfg.adaptive else "off",
            "spec_cost_ratio": round(self.proposer.cost_ratio, 4),
        }

    def stats(self) -> dict[str, int]:
        return {
            "spec_proposed_tokens": self.proposed,
            "spec_accepted_tokens": self.accepted,
            "spec_drafts": self.drafts,
        }


def _before_constraint(seq: Sequence, draft: list[int]) -> list[int]:
    """``draft`` cut before the token its request's constraint starts after, where it has not started."""
    guided = seq.params.guided
    if guided is not None and guided.after >= 0 and guided.after in draft:
        if guided.after not in seq.token_ids[seq.num_prompt_tokens :]:
            return draft[: draft.index(guided.after)]
    return draft
