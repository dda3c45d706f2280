"""The engine's step for beam-search requests: a part of :class:`~.engine.Engine`, kept apart.

After a step, every running beam of a request proposes its continuations (the scoring is
:mod:`.beam_search`'s); a beam chosen once continues in place, one chosen again is forked (its KV
blocks shared copy-on-write), beams not chosen are dropped. When the search ends, the request's
hypotheses go out as its sequences, best first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .. import wire
from .sequence import Group, Sequence, Status

if TYPE_CHECKING:
    from .block_manager import BlockManager
    from .scheduler import Scheduler


class BeamSteps:
    """Mixed into the engine, whose scheduler, block manager and counters it uses."""

    scheduler: Scheduler
    blocks: BlockManager
    generated_tokens: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    _step_size: int

    def _maybe_done(self, group: Group) -> None:  # the engine's
        raise NotImplementedError

    def _beam_step(self, group: Group, logits: torch.Tensor, rows: dict[int, int], deltas: list[wire.SeqDelta]) -> None:
        state = group.beam
        assert state is not None
        p = group.params
        beams = state.running
        index = torch.tensor([rows[s.seq_id] for s in beams], dtype=torch.long, device=logits.device)
        logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
        at_limit = [s.num_generated + 1 >= p.max_new_tokens or s.num_tokens + 1 >= self.max_model_len for s in beams]
        eos = frozenset() if p.ignore_eos else frozenset(self.eos_token_ids)
        survivors = state.step(logprobs, eos, at_limit)
        # a beam chosen once continues in place; chosen again, it is forked (before it grows)
        taken: set[int] = set()
        children: list[Sequence] = []
        for candidate in survivors:
            parent = beams[candidate.parent]
            if candidate.parent in taken:
                children.append(self._fork(parent))
            else:
                taken.add(candidate.parent)
                children.append(parent)
        for child, candidate in zip(children, survivors):
            child.token_ids.append(candidate.token)
            child.token_logprobs.append(candidate.logprob)
            child.cumulative_logprob = candidate.cumulative
            self.generated_tokens += 1
        for i, seq in enumerate(beams):
            if i not in taken:
                self.scheduler.finish(seq, "pruned")
        state.running, state.scores = children, [c.cumulative for c in survivors]
        if not state.done:
            return
        for seq in children:
            self.scheduler.finish(seq, "pruned")
        leader = group.leader
        for rank, hyp in enumerate(state.results()):
            delta = wire.SeqDelta(
                request_id=group.request_id,
                index=rank,
                token_ids=hyp.tokens,
                logprobs=hyp.logprobs,
                cumulative_logprob=hyp.score,
                finish_reason=hyp.finish_reason,
                num_prompt_tokens=leader.num_prompt_tokens,
                num_cached_tokens=leader.num_cached_prompt_tokens,
                batch_size=self._step_size,
            )
            deltas.append(delta)
        self._maybe_done(group)

    def _fork(self, parent: Sequence) -> Sequence:
        group = parent.group
        child = Sequence(group, len(group.sequences), list(parent.token_ids), parent.num_prompt_tokens)
        child.block_table = self.blocks.fork(parent)
        child.num_computed = parent.num_computed
        child.num_hashed_blocks = parent.num_hashed_blocks
        child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
        child.token_logprobs = list(parent.token_logprobs)
        child.first_scheduled = parent.first_scheduled
        child.status = Status.RUNNING
        group.sequences.append(child)
        self.scheduler.running.append(child)
        return child
