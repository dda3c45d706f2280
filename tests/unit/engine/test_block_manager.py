import pytest

from lmiserve.rolling_batch.scheduling.block_manager import BlockManager
from lmiserve.rolling_batch.scheduling.sequence import Group, Sequence
from lmiserve.wire import SamplingParams

BS = 4


def seq(tokens, params=None) -> Sequence:
    group = Group("r", params or SamplingParams())
    s = Sequence(group, 0, list(tokens), len(tokens))
    group.sequences.append(s)
    return s


def admit_all(bm: BlockManager, s: Sequence) -> list[int]:
    cached = bm.cached_prefix_blocks(s)
    n = s.num_tokens - len(cached) * bm.block_size
    bm.admit(s, cached, n)
    s.num_computed += n
    bm.commit(s)
    return cached


@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("delta,blocks", [(-1, 0), (0, 0), (1, 1)])
def test_blocks_at_multiples_of_block_size(k, delta, blocks):
    bm = BlockManager(64, BS)
    length = k * BS + delta
    s = seq(range(100, 100 + length))
    admit_all(bm, s)
    assert len(s.block_table) == k + blocks
    assert bm.num_used_blocks == k + blocks
    # one more decoded token needs a new block exactly when the last one is full
    s.token_ids.append(7)
    needs_new = length % BS == 0
    assert bm.blocks_needed(s, 1) == (1 if needs_new else 0)


def test_free_returns_every_block():
    bm = BlockManager(16, BS)
    s = seq(range(10))
    admit_all(bm, s)
    bm.free(s)
    assert bm.num_free_blocks == 16 and s.block_table == [] and s.num_computed == 0


def test_shared_prefix_reuses_full_blocks():
    bm = BlockManager(32, BS)
    a = seq(range(3 * BS + 1))
    admit_all(bm, a)
    b = seq(list(range(2 * BS + 3)) + [999, 998])
    cached = admit_all(bm, b)
    assert cached == a.block_table[:2]
    assert b.num_cached_prompt_tokens == 2 * BS
    assert all(bm.blocks[x].ref_count == 2 for x in cached)
    assert bm.prefix_hit_tokens == 2 * BS


@pytest.mark.parametrize("length,expected_hits", [(2 * BS - 1, 1), (2 * BS, 1), (2 * BS + 1, 2)])
def test_at_least_one_token_is_always_computed(length, expected_hits):
    bm = BlockManager(32, BS)
    tokens = list(range(length))
    admit_all(bm, seq(tokens + [5] * (3 * BS)))  # a longer sequence that holds the same prefix
    b = seq(tokens)
    cached = bm.cached_prefix_blocks(b)
    assert len(cached) == expected_hits
    assert len(cached) * BS < length


def test_freed_blocks_stay_cached_until_needed_tail_first():
    bm = BlockManager(6, BS)
    a = seq(range(3 * BS))
    admit_all(bm, a)
    prefix_blocks = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 6
    b = seq(list(range(2 * BS)) + [500])
    assert bm.cached_prefix_blocks(b) == prefix_blocks[:2]
    # taking 4 fresh blocks evicts the never-used free blocks first, then a's tail block
    c = seq(range(1000, 1000 + 4 * BS))
    admit_all(bm, c)
    assert prefix_blocks[2] in c.block_table
    assert bm.cached_prefix_blocks(b) == prefix_blocks[:2]


def test_prompt_logprobs_disable_prefix_hits():
    bm = BlockManager(32, BS)
    admit_all(bm, seq(range(3 * BS)))
    b = seq(range(3 * BS), SamplingParams(prompt_logprobs=0))
    assert bm.cached_prefix_blocks(b) == []


def test_prefix_caching_can_be_disabled():
    bm = BlockManager(32, BS, enable_prefix_caching=False)
    admit_all(bm, seq(range(3 * BS)))
    assert bm.cached_prefix_blocks(seq(range(3 * BS))) == []
