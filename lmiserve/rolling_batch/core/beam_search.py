"""Beam search over the paged cache: the scoring rules of transformers' beam search.

A beam request keeps ``width`` running sequences. After each step every running beam
proposes its continuations; the best ``k = max(2, 1 + #eos) * width`` of all of them
(cumulative log-probability) are examined in order: those that end (an EOS token, or the
length limit) and rank among the first ``width`` become finished hypotheses scored
``cumulative / generated_length ** length_penalty``; the best ``width`` that go on become the
next running beams. A beam chosen twice is forked (its KV blocks shared, copy-on-write).
Search stops when the best running beam can no longer beat the worst of ``width`` finished
hypotheses (transformers' default heuristic), when every candidate ended, or with
``early_stopping`` as soon as ``width`` hypotheses are finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ... import wire
from ..scheduling.block_manager import BlockManager
from ..scheduling.scheduler import Scheduler
from ..scheduling.sequence import Group, Sequence, Status

NEG = -1.0e9


@dataclass
class Hypothesis:
    score: float
    tokens: list[int]
    logprobs: list[float]
    cumulative: float
    finish_reason: str


@dataclass
class Candidate:
    parent: int
    """Index of the running beam it continues."""
    token: int
    cumulative: float
    logprob: float


@dataclass
class BeamState:
    width: int
    n: int
    length_penalty: float = 1.0
    early_stopping: bool = False
    running: list[Sequence] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    finished: list[Hypothesis] = field(default_factory=list)
    improvable: bool = True
    done: bool = False

    def _finish(self, hyp: Hypothesis) -> None:
        self.finished.append(hyp)
        self.finished.sort(key=lambda h: h.score, reverse=True)
        del self.finished[self.width :]

    def step(
        self,
        logprobs: torch.Tensor,
        eos_ids: frozenset[int],
        ends_at_length: list[bool],
    ) -> list[Candidate]:
        """One search step. ``logprobs`` holds one row per running beam (log-softmax of its
        logits); ``ends_at_length[i]`` says whether a token appended to beam i reaches a length
        limit. Returns the next running beams, best first."""
        rows, vocab = logprobs.shape
        scores = torch.tensor(self.scores, dtype=logprobs.dtype, device=logprobs.device).unsqueeze(1)
        accumulated = (logprobs + scores).view(-1)
        keep = min(max(2, 1 + len(eos_ids)) * self.width, accumulated.numel())
        values, indices = torch.topk(accumulated, keep)
        parents = (indices // vocab).tolist()
        tokens = (indices % vocab).tolist()
        values_list = values.tolist()
        token_lps = logprobs.view(-1)[indices].tolist()
        generated = [self.running[p].num_generated + 1 for p in parents]

        ends = [tok in eos_ids or ends_at_length[p] for p, tok in zip(parents, tokens)]
        full = len(self.finished) >= self.width
        for rank in range(min(self.width, keep)):
            if not ends[rank] or not self.improvable or (self.early_stopping and full):
                continue
            seq = self.running[parents[rank]]
            gen = seq.token_ids[seq.num_prompt_tokens :] + [tokens[rank]]
            lps = seq.token_logprobs + [token_lps[rank]]
            reason = "eos_token" if tokens[rank] in eos_ids else "length"
            score = values_list[rank] / (generated[rank] ** self.length_penalty)
            self._finish(Hypothesis(score, gen, lps, values_list[rank], reason))

        going = [i for i in range(keep) if not ends[i]][: self.width]
        survivors = [Candidate(parents[i], tokens[i], values_list[i], token_lps[i]) for i in going]

        # can a running beam still beat the worst finished hypothesis?
        if survivors and len(self.finished) >= self.width:
            best_possible = survivors[0].cumulative / (generated[going[0]] ** self.length_penalty)
            self.improvable = self.improvable and best_possible > self.finished[-1].score
        if not survivors or not self.improvable or (self.early_stopping and len(self.finished) >= self.width):
            self.done = True
        return survivors

    def results(self) -> list[Hypothesis]:
        return self.finished[: self.n]


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
