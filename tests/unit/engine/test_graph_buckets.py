"""Which batch sizes get a decode graph, and which graph a step of n sequences replays."""

import pytest

from lmiserve.rolling_batch.runner.graphs import BUCKETS, graph_buckets


@pytest.mark.parametrize(
    "max_num_seqs,expected",
    [(1, [1]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]), (33, [1, 2, 4, 8, 16, 24, 32, 33])],
)
def test_buckets_cover_every_batch_up_to_the_limit(max_num_seqs, expected):
    assert graph_buckets(max_num_seqs) == expected


def test_large_limits():
    assert graph_buckets(256)[-1] == 256 and graph_buckets(256)[:4] == [1, 2, 4, 8]
    assert graph_buckets(10_000) == list(BUCKETS)


def test_buffer_rows_start_16_bytes_apart():
    from lmiserve.rolling_batch.runner.graphs import aligned_rows

    assert [aligned_rows(n, 8) for n in (1, 2, 5, 512)] == [2, 2, 6, 512]
    assert [aligned_rows(n, 4) for n in (1, 4, 5)] == [4, 4, 8]
