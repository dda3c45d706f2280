"""The scheduler with a fake model: each step appends token 1 to every sequence that samples."""

from lmiserve.rolling_batch.scheduling.block_manager import BlockManager
from lmiserve.rolling_batch.scheduling.scheduler import Scheduler, SchedulerConfig
from lmiserve.rolling_batch.scheduling.sequence import Group, Sequence, Status
from lmiserve.wire import SamplingParams

BS = 4


def scheduler(blocks: BlockManager, **limits) -> Scheduler:
    return Scheduler(SchedulerConfig(**limits), blocks)


def request(rid, prompt_len, max_new=4, best_of=1, first_token=0):
    group = Group(rid, SamplingParams(max_new_tokens=max_new, best_of=best_of, n=1))
    for i in range(best_of):
        prompt = list(range(first_token, first_token + prompt_len))
        group.sequences.append(Sequence(group, i, prompt, prompt_len))
    return group


def step(sched: Scheduler):
    out = sched.schedule()
    sched.after_step(out)
    for item in out.scheduled:
        if item.samples:
            s = item.seq
            s.token_ids.append(1)
            if s.num_generated >= s.params.max_new_tokens:
                sched.finish(s, "length")
    return out


def run(sched: Scheduler, max_steps=500):
    steps = []
    while sched.has_work() and len(steps) < max_steps:
        steps.append(step(sched))
    assert not sched.has_work()
    return steps


def test_long_prompt_is_prefilled_in_chunks_beside_running_decodes():
    sched = scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=8, max_model_len=256)
    short = request("short", 3, max_new=10)
    sched.add(short)
    step(sched)  # short prefilled, now decoding
    long = request("long", 20, max_new=2)
    sched.add(long)
    chunks = []
    for _ in range(3):
        out = step(sched)
        assert [d.seq.request_id for d in out.decodes] == ["short"]  # the decode runs every step
        chunks.append([p.num_tokens for p in out.prefills if p.seq.request_id == "long"])
        assert out.num_tokens <= 8
    assert chunks == [[7], [7], [6]]
    assert long.leader.num_computed == 20 and long.leader.num_generated == 1


def test_preempted_sequence_is_recomputed_and_finishes():
    # room for 6 blocks of 4 tokens: two sequences cannot both grow to 16 tokens
    sched = scheduler(BlockManager(6, BS), max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    a, b = request("a", 6, max_new=10), request("b", 6, max_new=10, first_token=50)
    sched.add(a)
    sched.add(b)
    steps = run(sched)
    preempted = [s for out in steps for s in out.preempted]
    assert preempted and all(s.request_id == "b" for s in preempted)  # the newest one gives way
    assert a.leader.finish_reason == "length" and b.leader.finish_reason == "length"
    assert a.leader.num_generated == 10 and b.leader.num_generated == 10
    assert sched.blocks.num_free_blocks == 6
    assert sched.num_preemptions == len(preempted)


def test_waiting_request_waits_for_blocks_instead_of_failing():
    sched = scheduler(BlockManager(4, BS), max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16)
    a, b = request("a", 12, max_new=2), request("b", 12, max_new=2, first_token=40)
    sched.add(a)
    sched.add(b)
    first = step(sched)
    assert [p.seq.request_id for p in first.prefills] == ["a"]
    assert b.leader.status is Status.WAITING
    run(sched)
    assert b.leader.finish_reason == "length"


def test_running_limit():
    sched = scheduler(BlockManager(64, BS), max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    groups = [request(f"r{i}", 3, max_new=3, first_token=10 * i) for i in range(5)]
    for g in groups:
        sched.add(g)
    for out in run(sched):
        assert len(sched.running) <= 2
        assert len(out.scheduled) <= 2
    assert all(g.leader.finish_reason == "length" for g in groups)


def test_abort_frees_blocks_by_the_next_step():
    sched = scheduler(BlockManager(16, BS), max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    g = request("gone", 9, max_new=50)
    sched.add(g)
    step(sched)
    assert sched.blocks.num_used_blocks == 3
    for seq in g.sequences:
        sched.finish(seq, "abort")
    assert sched.blocks.num_free_blocks == 16
    assert g.leader.finish_reason == "abort"
    assert not sched.schedule()


def test_siblings_wait_for_the_leader_then_hit_the_prefix_cache():
    sched = scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    g = request("n", 10, max_new=3, best_of=3)
    sched.add(g)
    first = step(sched)
    assert [p.seq.index for p in first.prefills] == [0]
    second = step(sched)
    siblings = [p for p in second.prefills if p.seq.index > 0]
    assert [p.num_tokens for p in siblings] == [2, 2]  # 8 of 10 prompt tokens came from the cache
    assert all(p.seq.num_cached_prompt_tokens == 8 for p in siblings)
    run(sched)
    assert all(s.finish_reason == "length" for s in g.sequences)


def test_prefix_cache_hits_across_requests():
    sched = scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    first = request("a", 13, max_new=1)
    sched.add(first)
    run(sched)
    again = request("b", 13, max_new=1)
    sched.add(again)
    out = sched.schedule()
    assert out.prefills[0].num_tokens == 1
    assert again.leader.num_cached_prompt_tokens == 12


def test_max_prefill_seqs_limits_the_prompts_of_one_step():
    sched = scheduler(
        BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, max_prefill_seqs=2
    )
    groups = [request(f"r{i}", 3, max_new=2, first_token=10 * i) for i in range(5)]
    for g in groups:
        sched.add(g)
    steps = run(sched)
    assert [len(out.prefills) for out in steps][:3] == [2, 2, 1]
    assert all(len(out.prefills) <= 2 for out in steps)
    assert all(g.leader.finish_reason == "length" for g in groups)


def test_a_step_that_decodes_takes_few_prompt_tokens_and_one_that_does_not_takes_the_budget():
    """Prompts arriving together are prefilled in one step and then decode in step; a prompt that
    arrives while others decode is taken in small chunks, so their streams are not held up."""
    sched = scheduler(
        BlockManager(64, BS),
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=64,
        max_decode_step_prefill_tokens=6,
    )
    for rid in "ab":
        sched.add(request(rid, 20, max_new=8))
    first = step(sched)
    assert [i.num_tokens for i in first.prefills] == [20, 20] and not first.decodes
    sched.add(request("c", 20, max_new=4, first_token=100))
    chunks = []
    while any(s.request_id == "c" and s.num_computed < 20 for s in sched.running + list(sched.waiting)):
        out = step(sched)
        assert len(out.decodes) == 2 and sum(i.num_tokens for i in out.prefills) <= 6
        chunks.append(sum(i.num_tokens for i in out.prefills))
    assert chunks == [6, 6, 6, 2]
    run(sched)


def cpu_like(max_num_seqs: int, per_seq: int | None, cap: int | None = None, measured: int = 0) -> Scheduler:
    """A scheduler with a CPU's 2,048-token step budget, under a per-sequence prompt share."""
    return scheduler(
        BlockManager(512, BS),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2048,
        max_model_len=512,
        max_decode_step_prefill_tokens=cap,
        decode_step_prefill_tokens_per_sequence=per_seq,
        measured_share=measured,
    )


def test_a_step_that_decodes_takes_prompt_tokens_in_proportion_to_the_sequences_in_the_batch():
    """A decoding step takes MIN_DECODE_STEP_PREFILL prompt tokens and a few per sequence running
    or waiting (in proportion fewer below FULL_SHARE_SEQUENCES sequences), never more than
    max_decode_step_prefill_tokens; a rest of at most a quarter more is taken whole."""
    from lmiserve.rolling_batch.scheduling.prompt_budget import FULL_SHARE_SEQUENCES, MIN_DECODE_STEP_PREFILL

    def chunks_beside(decoding: int, per_seq: int, cap: int, measured: int = 0) -> list[int]:
        sched = cpu_like(64, per_seq, cap, measured)
        for i in range(decoding):
            sched.add(request(f"d{i}", 4, max_new=100, first_token=1000 + 10 * i))
        while sched.waiting or any(s.num_computed < s.num_prompt_tokens for s in sched.running):
            step(sched)  # prefilled (in one step, or a few under a small share), now decoding
        sched.add(request("late", 300, max_new=2))
        chunks = []
        while sched.running[-1].request_id != "late" or sched.running[-1].num_computed < 300:
            out = step(sched)
            assert len(out.decodes) == decoding
            chunks.append(sum(i.num_tokens for i in out.prefills))
        return chunks

    assert (MIN_DECODE_STEP_PREFILL, FULL_SHARE_SEQUENCES) == (16, 8)
    # 3 decoding + 1 waiting: 16 + 6 x 4 x 4/8 = 28; the last 20 are within a quarter of it
    assert chunks_beside(3, 6, 512) == [28] * 10 + [20]
    # 7 decoding + 1: the whole share from 8 sequences on, 16 + 8 x 6 = 64; 108 left is more than
    # a quarter past it, 44 is not
    assert chunks_beside(7, 6, 512) == [64] * 4 + [44]
    # 15 decoding + 1: 16 + 16 x 6 = 112; the last 76 whole
    assert chunks_beside(15, 6, 512) == [112, 112, 76]
    # 40 decoding + 1: 16 + 41 x 6 = 262, capped at 100
    assert chunks_beside(40, 6, 100) == [100, 100, 100]
    # capped at 110: a rest of 110 is taken whole, one of 120 (within a quarter of 110, past the cap) is not
    assert chunks_beside(40, 6, 110) == [110, 110, 80]
    # a measured share under the one taken: a longer ramp, fewer tokens on top, none from half
    assert cpu_like(64, 4, None, 4).prompt_budget.ramp == cpu_like(64, 4).prompt_budget.ramp == (8, 16)
    assert cpu_like(64, 4, None, 3).prompt_budget.ramp == (11, 8)
    assert cpu_like(64, 4, None, 2).prompt_budget.ramp == (16, 0)
    assert cpu_like(64, 4, None, 1).prompt_budget.ramp == (16, 0)  # never past twice as many sequences
    # 7 decoding + 1, measured 2 under 4: 4 x 8 x 8/16 = 16, the floor (without the measurement
    # 16 + 8 x 4 = 48)
    assert chunks_beside(7, 4, 512, measured=2) == [16] * 18 + [12]
    assert chunks_beside(7, 4, 512) == [48] * 5 + [60]
    # 31 decoding + 1: 32 x 4 = 128
    assert chunks_beside(31, 4, 512, measured=2) == [128, 128, 44]


def test_a_short_rest_of_a_prompt_is_not_left_for_another_step():
    """Beside decodes, a prompt whose rest exceeds the step's share by at most a quarter of it is
    taken whole (its first token would wait a whole further step for the tail); a longer rest is
    cut at the share, and without the per-sequence limit nothing changes."""

    def chunks_of(prompt: int, per_seq: int | None, cap: int | None = None) -> list[int]:
        sched = cpu_like(64, per_seq, cap)
        for i in range(15):
            sched.add(request(f"d{i}", 4, max_new=100, first_token=1000 + 10 * i))
        step(sched)
        sched.add(request("late", prompt, max_new=2))
        chunks = []
        while sched.running[-1].request_id != "late" or sched.running[-1].num_computed < prompt:
            chunks.append(sum(i.num_tokens for i in step(sched).prefills))
        return chunks

    # 16 + 16 sequences x 8 = 144 a step, a quarter more 180
    assert chunks_of(130, 8) == [130]
    assert chunks_of(180, 8) == [180]
    assert chunks_of(181, 8) == [144, 37]
    assert chunks_of(300, 8) == [144, 156]
    # max_decode_step_prefill_tokens still bounds the step
    assert chunks_of(130, 8, 128) == [128, 2]
    # no per-sequence limit: the whole prompt fits the step's budget anyway
    assert chunks_of(300, None) == [300]


def test_prompts_arriving_together_start_one_after_the_other_under_the_per_sequence_limit():
    """With nothing decoding, the per-sequence limit still holds beyond the next prompt, which is
    taken whole: eight prompts that arrive together start in turn, not all in the first step."""

    def first_steps(per_seq):
        sched = cpu_like(16, per_seq)
        for i in range(8):
            sched.add(request(f"r{i}", 50, max_new=40, first_token=100 * i))
        return [[(i.seq.request_id, i.num_tokens) for i in step(sched).prefills] for _ in range(4)]

    # without the limit, all eight in one step: they decode, end and come back together
    assert first_steps(None)[0] == [(f"r{i}", 50) for i in range(8)]
    # with it: r0 whole (more than the 16 + 8 x 2 = 32-token share), then 32 tokens a step
    # (r2's last 36, within a quarter more, whole)
    assert first_steps(2) == [[("r0", 50)], [("r1", 32)], [("r1", 18), ("r2", 14)], [("r2", 36)]]
    # a smaller share: 16 + 8 = 24 tokens a step, r1's last 26 whole
    assert first_steps(1) == [[("r0", 50)], [("r1", 24)], [("r1", 26)], [("r2", 24)]]
