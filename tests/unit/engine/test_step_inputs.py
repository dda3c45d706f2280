"""A step's inputs, built for the whole step at once, against a token-by-token construction."""

import random

import numpy as np
import pytest
import torch

from lmiserve.rolling_batch.runner.step_inputs import build_step_arrays, step_tensors
from lmiserve.rolling_batch.scheduling.scheduler import ScheduledSeq, SchedulerOutput
from lmiserve.rolling_batch.scheduling.sequence import Group, Sequence
from lmiserve.wire import SamplingParams

BS = 16


def _seq(rng, length, start, count, decode):
    group = Group(f"r{rng.random()}", SamplingParams())
    seq = Sequence(group, 0, [rng.randrange(1000) for _ in range(length)], length)
    seq.block_table = rng.sample(range(500), -(-length // BS))
    return ScheduledSeq(seq, count, start, True, decode)


def _random_step(seed):
    rng = random.Random(seed)
    decodes = []
    for _ in range(rng.randrange(0, 6)):
        n = rng.randrange(1, 300)
        decodes.append(_seq(rng, n, n - 1, 1, True))
    prefills = []
    for _ in range(rng.randrange(0 if decodes else 1, 4)):
        n = rng.randrange(1, 300)
        start = rng.choice([0, rng.randrange(0, n)])
        prefills.append(_seq(rng, n, start, n - start, False))
    return SchedulerOutput(decodes=decodes, prefills=prefills)


def _token_by_token(out):
    ids, positions, slots, cu = [], [], [], [0]
    for item in out.decodes + out.prefills:
        for p in range(item.start, item.start + item.num_tokens):
            ids.append(item.seq.token_ids[p])
            positions.append(p)
            slots.append(item.seq.block_table[p // BS] * BS + p % BS)
        cu.append(cu[-1] + item.num_tokens)
    return ids, positions, slots, cu


@pytest.mark.parametrize("seed", range(40))
def test_arrays_equal_the_token_by_token_construction(seed):
    out = _random_step(seed)
    arrays = build_step_arrays(out, BS)
    ids, positions, slots, cu = _token_by_token(out)
    items = out.decodes + out.prefills
    assert arrays.input_ids.tolist() == ids
    assert arrays.positions.tolist() == positions
    assert arrays.slots.tolist() == slots
    assert arrays.cu_q_lens.tolist() == cu
    assert arrays.seq_lens.tolist() == [i.start + i.num_tokens for i in items]
    assert arrays.num_decodes == len(out.decodes)
    assert arrays.max_q_len == max(i.num_tokens for i in items)
    width = max(len(i.seq.block_table) for i in items)
    assert arrays.block_tables.dtype == np.int32 and arrays.block_tables.shape == (len(items), width)
    for row, item in zip(arrays.block_tables.tolist(), items):
        assert row == item.seq.block_table + [0] * (width - len(item.seq.block_table))


@pytest.mark.parametrize("seed", range(10))
def test_tensors_for_one_call_and_for_decode_and_prefill_calls(seed):
    out = _random_step(seed)
    arrays = build_step_arrays(out, BS)
    nd = len(out.decodes)
    ids, pos, meta = step_tensors(arrays, "cpu")
    assert ids.dtype == pos.dtype == meta.slot_mapping.dtype == torch.long
    assert meta.slot_mapping.tolist() == arrays.slots.tolist()
    paged = meta.paged
    assert paged.block_tables.dtype == torch.int32 and paged.block_tables.is_contiguous()
    assert paged.cu_q_lens.tolist() == paged.host_cu_q_lens == arrays.cu_q_lens.tolist()
    assert paged.seq_lens.tolist() == paged.host_seq_lens == arrays.seq_lens.tolist()
    assert paged.max_q_len == arrays.max_q_len
    # every array a kernel reads starts 16-byte aligned, whatever the step's sizes
    for t in (ids, pos, meta.slot_mapping, paged.block_tables, paged.cu_q_lens, paged.seq_lens):
        assert t.data_ptr() % 16 == 0
    decodes, prompts = paged.parts()
    assert paged.num_decodes == decodes.num_seqs == nd
    if nd:
        assert decodes.block_tables.tolist() == arrays.block_tables[:nd].tolist()
        assert decodes.seq_lens.tolist() == arrays.seq_lens[:nd].tolist()
    if out.prefills:
        assert prompts.block_tables.tolist() == arrays.block_tables[nd:].tolist()
        assert prompts.cu_q_lens.tolist() == (arrays.cu_q_lens[nd:] - nd).tolist()
        assert prompts.seq_lens.tolist() == arrays.seq_lens[nd:].tolist()
    else:
        assert prompts.num_seqs == 0


@pytest.mark.parametrize("runs", [1, 2, 3, 5])
def test_adapter_runs_on_the_device_start_aligned(runs):
    from lmiserve.rolling_batch.ops.metadata import LoraStep

    segments = [(i % 2, 3 * i, 3 * i + 3) for i in range(runs)]
    slots, firsts, ends = LoraStep(segments).tensors()
    assert list(zip(slots.tolist(), firsts.tolist(), ends.tolist())) == segments
    assert all(t.data_ptr() % 16 == 0 for t in (slots, firsts, ends))
