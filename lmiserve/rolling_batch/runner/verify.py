"""Checking proposed tokens: which of a verify run's proposals the model keeps, and its own next token.

A verify run is a decoding sequence's last token followed by ``k`` proposed tokens, run through the
model as one causal run (:class:`~..scheduling.step_batch.SchedulerOutput.verifies`); its ``k + 1``
logits rows each give the model's distribution after one more of the proposals. Every row is
processed as the sampler processes a decode's row with the proposals before it taken as output
(penalties, ``min_new_tokens``, bad words, the grammar's mask), then:

- greedy: the proposals up to the first that is not the row's argmax are kept, and that row's
  argmax follows them (all kept: the last row's, the bonus token);
- sampling: the rejection rule of speculative sampling (:mod:`.rejection`), which
  keeps the model's distribution exactly; in deterministic mode, each row draws from the sequence's
  generator as a plain decode would and the proposals are kept while they equal the draws, so the
  text is the one the sequence gets without proposals.

The comparison runs on the device; one copy brings back the counts kept, the tokens and their
log-probabilities (and the top alternatives asked for).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from ...generation.sampling import sample_rows
from ..scheduling.sequence import Sequence
from .rejection import rejection_rows
from .sampler import LogitRows, Sampler, _argmax_logsumexp, _ban_bad_words, _on_device, _penalized


@dataclass
class Checked:
    """What a verify run keeps: the accepted proposals then the model's token."""

    seq: Sequence
    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None
    proposed: int


class Position:
    """A verify run's row as the sampler sees a sequence: its tokens are the sequence's and the
    proposals before the row."""

    def __init__(self, seq: Sequence, draft: Seq[int], j: int):
        self.seq, self.params, self.seq_id, self.index = seq, seq.params, seq.seq_id, seq.index
        self.num_prompt_tokens = seq.num_prompt_tokens
        self.num_generated = seq.num_generated + j
        self._draft, self._j = draft, j

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids + list(self._draft[: self._j])


class Verifier:
    def __init__(self, sampler: Sampler, deterministic: bool = False):
        self.sampler = sampler
        self.deterministic = deterministic

    def check(self, logits: torch.Tensor, rows: LogitRows, eos: Seq[int]) -> list[Checked]:
        """The kept tokens of every verify run of ``rows`` (its rows of ``logits``)."""
        if not rows.verified:
            return []
        first = rows.verified[0][1]
        count = sum(item.num_tokens for item, _ in rows.verified)
        logits = logits[first : first + count]
        dev = logits.device
        sampler = self.sampler
        views = [Position(item.seq, item.draft, j) for item, _ in rows.verified for j in range(item.num_tokens)]
        argmax, lse = sampler.ops.argmax_logsumexp(logits) if sampler.ops else _argmax_logsumexp(logits)
        scores, targets = logits, argmax
        penalized = _penalized(views)
        guided = sampler.guided is not None and any(v.params.guided is not None for v in views)
        if penalized or guided or any(v.params.min_new_tokens or v.params.bad_word_ids for v in views):
            scores = logits.clone()
            if penalized:
                sampler._apply_penalties(scores, views, penalized)
            sampler._suppress_early_stop(scores, views, eos)
            _ban_bad_words(scores, views)
            if guided:
                at = 0
                for item, _ in rows.verified:
                    if item.seq.params.guided is not None:
                        sampler.guided.mask_run(scores, at, item.seq, item.draft)
                    at += item.num_tokens
            targets = torch.argmax(scores, dim=-1)
        drafts, owners, offsets = [], [], []
        for s, (item, _) in enumerate(rows.verified):
            offsets.append(len(drafts))
            drafts += [*item.draft, -1]
            owners += [s] * item.num_tokens
        draft = _on_device(drafts + owners, torch.long, dev)
        draft, owner = draft[:count], draft[count:]
        accept = targets == draft
        stop = targets  # the token a run ends with, should it end at the row
        sampled = [r for r, v in enumerate(views) if v.params.do_sample]
        if sampled:
            accept, stop = self._sampled(scores, views, sampled, lse.unsqueeze(1), draft, accept, stop)
        # kept per run: the index of its first row that is not accepted (its last row never is)
        position = torch.arange(count, device=dev) - _on_device(offsets, torch.long, dev).index_select(0, owner)
        runs = len(rows.verified)
        kept = torch.full((runs,), count, dtype=torch.long, device=dev)
        kept = kept.scatter_reduce(0, owner, torch.where(accept, count, position), reduce="amin")
        chosen = torch.where(accept, draft, stop)
        logprob = (logits.gather(1, chosen.unsqueeze(1)).squeeze(1) - lse).double()
        parts = [kept.double(), chosen.double(), logprob]
        k = max(v.params.logprobs for v in views)
        if k > 0:
            values, indices = logits.topk(k, dim=-1)
            parts += [indices.double().ravel(), (values - lse.unsqueeze(1)).double().ravel()]
        host = torch.cat(parts).tolist()  # the one read of the device
        return self._results(host, rows, offsets, count, k)

    def _sampled(
        self,
        scores: torch.Tensor,
        views: list[Position],
        sampled: list[int],
        lse: torch.Tensor,
        draft: torch.Tensor,
        accept: torch.Tensor,
        stop: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Acceptance and ending tokens of the rows of sampling sequences."""
        dev = scores.device
        index = _on_device(sampled, torch.long, dev)
        sub = [views[r] for r in sampled]
        probs = self.sampler.probabilities(scores.index_select(0, index), sub, lse.index_select(0, index))
        gens = [self.sampler.generator_for(v.seq, probs[i]) for i, v in enumerate(sub)]
        rows_draft = draft.index_select(0, index)
        if self.deterministic:
            ok, end = _draws_in_order(probs, rows_draft, gens, [v.seq.seq_id for v in sub])
        else:
            ok, end = rejection_rows(probs, None, rows_draft, gens)
        return accept.index_copy(0, index, ok), stop.index_copy(0, index, end)

    @staticmethod
    def _results(host: list[float], rows: LogitRows, offsets: list[int], count: int, k: int) -> list[Checked]:
        runs = len(rows.verified)
        kept, chosen, logprob = host[:runs], host[runs : runs + count], host[runs + count : runs + 2 * count]
        ids, values = host[runs + 2 * count : runs + 2 * count + count * k], host[runs + 2 * count + count * k :]
        out = []
        for s, (item, _) in enumerate(rows.verified):
            rows_kept = range(offsets[s], offsets[s] + int(kept[s]) + 1)
            top = None
            if k > 0:
                want = item.seq.params.logprobs
                top = [[(int(ids[r * k + j]), values[r * k + j]) for j in range(want)] for r in rows_kept]
            out.append(
                Checked(
                    item.seq, [int(chosen[r]) for r in rows_kept], [logprob[r] for r in rows_kept], top, len(item.draft)
                )
            )
        return out


def _draws_in_order(
    probs: torch.Tensor, draft: torch.Tensor, gens: list[torch.Generator], owners: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic mode's rule: each row draws from its generator as a decode would, in order, and
    a run stops drawing at its first row whose draw is not the proposal (so a sequence's generator
    advances once per token it keeps, as without proposals)."""
    accept = torch.zeros(probs.shape[0], dtype=torch.bool, device=probs.device)
    stop = torch.zeros(probs.shape[0], dtype=torch.long, device=probs.device)
    proposals = draft.tolist()
    stopped: set[int] = set()
    for r in range(probs.shape[0]):
        if owners[r] in stopped:
            continue
        token = int(sample_rows(probs[r : r + 1], [gens[r]])[0])
        stop[r] = token
        if token == proposals[r]:
            accept[r] = True
        else:
            stopped.add(owners[r])
    return accept, stop
