"""Sampling with proposals keeps the model's distribution: chi-square tests of the rejection rule
(where a wrong rule fails), of the verify step's rows, and deterministic mode's same-text rule."""

from __future__ import annotations

import torch

from lmiserve.config.speculative import parse_speculative
from lmiserve.rolling_batch.runner.rejection import rejection_rows
from lmiserve.rolling_batch.runner.sampler import LogitRows, Sampler
from lmiserve.rolling_batch.runner.verify import Verifier
from lmiserve.rolling_batch.scheduling.scheduler import ScheduledSeq
from lmiserve.rolling_batch.scheduling.sequence import Group, Sequence
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine

CRITICAL = {4: 18.47, 5: 20.52, 9: 27.88}
"""Chi-square values a correct rule exceeds with probability 0.001, by degrees of freedom."""


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def _first_tokens(p: torch.Tensor, q: torch.Tensor, n: int, rule=rejection_rows) -> torch.Tensor:
    """The token each of ``n`` one-proposal runs ends its first position with."""
    gen = torch.Generator().manual_seed(1234)
    draft = torch.multinomial(q, n, replacement=True, generator=gen)
    rows_p, rows_q = p.expand(n, -1), q.expand(n, -1)
    accept, stop = rule(rows_p, rows_q, draft, [gen] * n)
    return torch.where(accept, draft, stop)


def _wrong_rule(p, q, draft, gens):
    """Accepts as the rule does, but draws a refused row from ``p`` itself (no residual)."""
    accept, _ = rejection_rows(p, q, draft, gens)
    return accept, torch.multinomial(p, 1, generator=gens[0]).squeeze(1)


def test_rejection_rule_keeps_the_target_distribution():
    p = torch.tensor([0.05, 0.3, 0.1, 0.25, 0.2, 0.1])
    q = torch.tensor([0.3, 0.05, 0.3, 0.05, 0.2, 0.1])
    n = 20000
    good = torch.bincount(_first_tokens(p, q, n), minlength=6).double()
    assert _chi2(good, p.double()) < CRITICAL[5]
    wrong = torch.bincount(_first_tokens(p, q, n, _wrong_rule), minlength=6).double()
    assert _chi2(wrong, p.double()) > CRITICAL[5]


def test_one_hot_proposals_and_the_bonus_row():
    """A picked proposal (q one-hot) is kept with probability p(x); a row without one draws from p."""
    p = torch.tensor([0.1, 0.4, 0.2, 0.2, 0.1])
    n = 20000
    gen = torch.Generator().manual_seed(7)
    draft = torch.full((n,), 1)
    accept, stop = rejection_rows(p.expand(n, -1), None, draft, [gen] * n)
    tokens = torch.where(accept, draft, stop)
    assert _chi2(torch.bincount(tokens, minlength=5).double(), p.double()) < CRITICAL[4]
    assert not bool((stop[~accept] == 1).any())  # a refused proposal is never drawn again
    bonus_accept, bonus = rejection_rows(p.expand(n, -1), None, torch.full((n,), -1), [gen] * n)
    assert not bool(bonus_accept.any())
    assert _chi2(torch.bincount(bonus, minlength=5).double(), p.double()) < CRITICAL[4]


def _run_rows(logits: torch.Tensor, draft: tuple[int, ...], seed: int, deterministic: bool = False):
    params = SamplingParams(do_sample=True, temperature=1.0, max_new_tokens=10, seed=seed)
    group = Group("r", params)
    seq = Sequence(group, 0, [1, 2, 3], 3, num_computed=2)
    group.sequences.append(seq)
    item = ScheduledSeq(seq, 1 + len(draft), 2, True, False, draft)
    rows = LogitRows.of([], [], [item])
    return Verifier(Sampler("cpu"), deterministic).check(logits, rows, ())[0].tokens


def test_verify_rows_sample_the_model_two_positions_deep():
    """Runs of one proposal: the first token follows row 0's distribution; where it is the proposal,
    the second follows row 1's (the bonus row)."""
    vocab = 10
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(3)) * 1.5
    p0, p1 = torch.softmax(logits[0], -1).double(), torch.softmax(logits[1], -1).double()
    proposal = int(torch.argmax(p0))
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    for seed in range(4000):
        tokens = _run_rows(logits, (proposal,), seed)
        first[tokens[0]] += 1
        if tokens[0] == proposal:
            assert len(tokens) == 2
            second[tokens[1]] += 1
        else:
            assert len(tokens) == 1
    assert _chi2(first.double(), p0) < CRITICAL[9]
    seen = p1 > 0.02  # compare where counts are large enough
    assert _chi2(second.double()[seen], p1[seen] / p1[seen].sum()) < 30.0


def test_deterministic_mode_sampled_text_is_the_same_with_proposals(tiny_llama_dir):
    """Deterministic mode draws each kept token as a decode would: a seeded sampled request's text is
    the same with and without speculation."""
    spec = parse_speculative(
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "adaptive": false}'
    )
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    params = SamplingParams(do_sample=True, temperature=0.7, seed=11, max_new_tokens=30)

    def text(script=None, **extra):
        engine = make_engine(tiny_llama_dir, deterministic=True, **extra)
        if script is not None:  # propose the text itself, every third run with a wrong second token
            proposer = engine._phases.speculation.proposer

            def propose(seqs, counts):
                found = []
                for seq, count in zip(seqs, counts):
                    at = seq.num_generated
                    run = list(script[at : at + count])
                    if at % 3 == 0 and len(run) > 1:
                        run[1] = (run[1] + 1) % 256
                    found.append(run)
                return found

            proposer.propose = propose
        engine.add_request("s", prompt, params)
        out = []
        while engine.has_work():
            for d in engine.step():
                out += d.token_ids
        return out, engine.stats()

    plain, _ = text()
    spec_out, stats = text(plain, speculative=spec)
    assert spec_out == plain
    assert stats.spec_drafts > 0
    assert stats.spec_proposed_tokens > stats.spec_accepted_tokens > 0
