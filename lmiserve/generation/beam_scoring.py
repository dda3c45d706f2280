"""Beam search's scoring rules, transformers' rules, whoever computes the log-probabilities.

A beam request keeps ``width`` running beams. After each step every running beam proposes its
continuations; the best ``k = max(2, 1 + #eos) * width`` of all of them (cumulative
log-probability) are examined in order: those that end (an EOS token, or the length limit) and
rank among the first ``width`` become finished hypotheses scored
``cumulative / generated_length ** length_penalty``; the best ``width`` that go on become the
next running beams. Search stops when the best running beam can no longer beat the worst of
``width`` finished hypotheses (transformers' default heuristic), when every candidate ended, or
with ``early_stopping`` as soon as ``width`` hypotheses are finished.

Our engine (``rolling_batch.core.beam_search``) runs them over its paged cache; the vLLM
backend (``rolling_batch.vllm.beam_search``) above vLLM's engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class Beam(Protocol):
    """What the rules read of a running beam."""

    token_ids: list[int]
    num_prompt_tokens: int
    token_logprobs: list[float]

    @property
    def num_generated(self) -> int: ...


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
    running: list[Any] = field(default_factory=list)
    """The running beams (:class:`Beam`), in the order of ``scores``."""
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
