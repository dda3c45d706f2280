"""Verify runs in the scheduler: a decoding sequence with proposals runs them in one run when the
budget and the blocks allow, counts as decoding for the prompt share of the step, and keeps only
the blocks its kept tokens need."""

from lmiserve.rolling_batch.scheduling.block_manager import BlockManager
from tests.unit.engine.test_scheduler import BS, request, scheduler, step


def _decoding(sched, rid="a", prompt=6):
    group = request(rid, prompt, max_new=20)
    sched.add(group)
    step(sched)  # prefilled; its first token appended
    return group.sequences[0]


def test_a_verify_run_beside_a_prompt_takes_the_decode_steps_prompt_share():
    sched = scheduler(
        BlockManager(64, BS), max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
        max_decode_step_prefill_tokens=8,
    )  # fmt: skip
    seq = _decoding(sched)
    sched.add(request("long", 40))
    seq.draft = [5, 6, 7]
    out = sched.schedule()
    assert [i.num_tokens for i in out.verifies] == [4] and out.verifies[0].draft == (5, 6, 7)
    assert not out.decodes
    assert [i.num_tokens for i in out.prefills] == [8]  # not the whole budget: a stream waits on it


def test_proposals_beyond_the_budget_run_as_a_plain_decode():
    sched = scheduler(BlockManager(64, BS), max_num_seqs=4, max_num_batched_tokens=4, max_model_len=256)
    seq = _decoding(sched, prompt=3)
    seq.draft = [5, 6, 7, 8]
    out = sched.schedule()
    assert not out.verifies and [i.num_tokens for i in out.decodes] == [1]


def test_accepted_keeps_the_blocks_of_kept_tokens_only():
    blocks = BlockManager(64, BS)
    sched = scheduler(blocks, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256)
    seq = _decoding(sched, prompt=7)  # 8 tokens, 7 computed
    seq.draft = [1, 2, 3, 4, 5, 6]
    out = sched.schedule()
    assert len(seq.block_table) == 4  # room for the 14 positions the run writes
    sched.after_step(out)
    seq.token_ids += [1, 9]  # one proposal kept, then the model's own token
    sched.accepted(seq)
    assert seq.num_computed == seq.num_tokens - 1 == 9
    assert len(seq.block_table) == 3 and blocks.num_free_blocks == 64 - 3
