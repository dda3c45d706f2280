"""Beam search over the paged cache, by the scoring rules of
:mod:`lmiserve.generation.beam_scoring`: a beam chosen twice is forked (its KV blocks shared,
copy-on-write); the others go on in place or are dropped."""

from __future__ import annotations

import torch

from ... import wire
from ...generation.beam_scoring import BeamState
from ..scheduling.block_manager import BlockManager
from ..scheduling.scheduler import Scheduler
from ..scheduling.sequence import Group, Sequence, Status


class BeamSearch:
    """The engine's part in beam-search requests: after a step, the request's beams go on, fork
    or drop as :class:`BeamState` decides; when the search ends, its hypotheses go out as the
    request's sequences, best first."""

    def __init__(self, scheduler: Scheduler, blocks: BlockManager, eos_token_ids: tuple[int, ...], max_model_len: int):
        self.scheduler = scheduler
        self.blocks = blocks
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    @staticmethod
    def start(group: Group, prompt_ids: list[int]) -> None:
        """A new request's search: one beam, the prompt."""
        p = group.params
        seq = Sequence(group, 0, list(prompt_ids), len(prompt_ids))
        group.sequences.append(seq)
        group.beam = BeamState(p.num_beams, p.n, p.length_penalty, p.early_stopping, [seq], [0.0])

    def step(self, group: Group, logprobs: torch.Tensor, batch_size: int) -> list[wire.SeqDelta]:
        """Advance the search by this step's log-probabilities of its running beams (one row
        each, in order); the request's deltas once the search has ended, else none."""
        state = group.beam
        assert state is not None
        p = group.params
        beams = state.running
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
        for i, seq in enumerate(beams):
            if i not in taken:
                self.scheduler.finish(seq, "pruned")
        state.running, state.scores = children, [c.cumulative for c in survivors]
        if not state.done:
            return []
        for seq in children:
            self.scheduler.finish(seq, "pruned")
        leader = group.leader
        deltas = []
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
                batch_size=batch_size,
            )
            deltas.append(delta)
        return deltas

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
