"""Prompt lookup's matches and the adaptive rule's choices (no model)."""

from __future__ import annotations

import numpy as np

from lmiserve.rolling_batch.speculative.adaptive import AdaptivePolicy, SeqRecord, interpolate
from lmiserve.rolling_batch.speculative.ngram import TokenHistory, lookup


def test_lookup_takes_the_longest_suffix_at_its_latest_place():
    tokens = np.array([1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3])
    assert lookup(tokens, 1, 3, 2) == [4, 5]  # "1 2 3" earlier, not "2 3" (later, shorter)
    assert lookup(tokens, 1, 2, 2) == [7, 1]  # "2 3" at its latest earlier place
    assert lookup(np.array([5, 6, 7, 5, 6]), 2, 2, 5) == [7, 5, 6]  # up to the end
    assert lookup(np.array([1, 2, 3]), 1, 3, 3) == []
    assert lookup(np.array([4, 4, 4]), 2, 2, 0) == []


def test_history_grows_with_the_sequence():
    history, tokens = TokenHistory(), [1, 2]
    assert history.of(tokens).tolist() == [1, 2]
    tokens += list(range(3, 200))
    assert history.of(tokens).tolist() == tokens


def test_one_stream_takes_proposals_a_loaded_batch_does_not():
    # memory-bound up to 4 rows, then every row costs as much as the first
    table = [(1, 0.020), (2, 0.021), (3, 0.022), (4, 0.023), (5, 0.043), (8, 0.10), (64, 1.2)]
    policy = AdaptivePolicy(4, table=table)
    assert policy.counts([SeqRecord(alpha=0.9)], [10], 1) == [3]  # the fifth row costs more than it gives
    batch = [SeqRecord(alpha=0.5) for _ in range(40)]
    assert sum(policy.counts(batch, [10] * 40, 40)) < 40
    assert interpolate([(1.0, 1.0), (3.0, 3.0)], 5.0) == 5.0


def test_low_acceptance_pauses_then_probes():
    policy = AdaptivePolicy(4, table=[(1, 0.02), (2, 0.03), (5, 0.08)])
    record = SeqRecord(alpha=0.1)
    assert policy.counts([record], [10], 1) == [0] and record.pause
    assert policy.counts([record], [11], 1) == [0]  # still paused
    assert policy.counts([record], [10 + record.pause], 1) == [1]  # a probe
    pause = record.pause
    policy.update(record, 1, 0, 20)
    assert record.pause == 2 * pause and record.resume_at == 20 + record.pause
    policy.update(record, 1, 1, 40)
    assert record.pause == 0 and record.alpha >= 0.6


def test_not_adaptive_always_proposes_the_setting():
    policy = AdaptivePolicy(5, adaptive=False)
    assert policy.counts([SeqRecord(alpha=0.0)] * 3, [1, 2, 3], 3) == [5, 5, 5]


def test_a_large_batch_leaves_a_well_kept_sequence_out_without_pausing_it():
    table = [(1, 0.02), (2, 0.021), (32, 0.06), (64, 0.12), (128, 0.24)]  # compute-bound from 32 rows
    policy = AdaptivePolicy(4, table=table)
    batch = [SeqRecord(alpha=0.95) for _ in range(32)]
    assert policy.counts(batch, [10] * 32, 32) == [0] * 32
    assert not any(r.pause for r in batch)  # no probes: its acceptance is known to be high
    assert policy.counts(batch[:1], [10], 1)[0] >= 1
