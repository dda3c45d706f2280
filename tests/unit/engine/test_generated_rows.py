"""Generated tokens in a prompt chunk are attended as the decodes that produced them."""

import numpy as np
import torch

from lmiserve.rolling_batch.ops.cpu import CpuOps
from lmiserve.rolling_batch.ops.generated_rows import generated_rows
from lmiserve.rolling_batch.ops.metadata import PagedAttentionInputs

BLOCK = 16


def test_only_prompt_chunk_rows_at_or_past_the_prompt_length_are_chosen():
    # a decode (sequence 0, position 40), then chunks: sequence 1 positions 0..5 (prompt 20),
    # sequence 2 positions 10..17 (prompt 12), sequence 3 positions 30..32 (prompt 31)
    positions = np.array([40, *range(0, 6), *range(10, 18), *range(30, 33)])
    cu = np.array([0, 1, 7, 15, 18], dtype=np.int32)
    tables = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]], dtype=np.int32)
    prompt_lens = np.array([30, 20, 12, 31], dtype=np.int32)
    got = generated_rows(positions, tables, cu, 1, prompt_lens, "cpu")
    assert got is not None
    assert got.rows.tolist() == [9, 10, 11, 12, 13, 14, 16, 17]
    assert got.paged.host_seq_lens == [13, 14, 15, 16, 17, 18, 32, 33]
    assert got.paged.num_decodes == 8 and got.paged.max_q_len == 1
    assert got.paged.block_tables.tolist() == [[6, 7, 8]] * 6 + [[9, 10, 11]] * 2
    assert generated_rows(positions, tables, cu, 1, np.array([0, 99, 99, 99], dtype=np.int32), "cpu") is None


def test_attention_gives_generated_rows_the_decode_kernels_result_and_prompt_rows_the_prompt_kernels():
    torch.manual_seed(0)
    ops = CpuOps()
    kv_heads, heads, dim, length, prompt = 2, 4, 64, 120, 70
    k_cache = torch.randn(8, BLOCK, kv_heads, dim).bfloat16()
    v_cache = torch.randn(8, BLOCK, kv_heads, dim).bfloat16()
    q = torch.randn(length, heads, dim).bfloat16()
    table = torch.arange(8, dtype=torch.int32).view(1, -1)
    cu, lens = torch.tensor([0, length], dtype=torch.int32), torch.tensor([length], dtype=torch.int32)
    chunk = PagedAttentionInputs.of(table, cu, lens, num_decodes=0)
    plain = ops.attention(q, k_cache, v_cache, chunk, dim**-0.5)
    chunk.generated = generated_rows(
        np.arange(length), table.numpy(), cu.numpy(), 0, np.array([prompt], dtype=np.int32), "cpu"
    )
    out = ops.attention(q, k_cache, v_cache, chunk, dim**-0.5)
    assert torch.equal(out[:prompt], plain[:prompt])
    for row in range(prompt, length):
        one = PagedAttentionInputs.of(
            table, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([row + 1], dtype=torch.int32)
        )
        decoded = ops.attention(q[row : row + 1], k_cache, v_cache, one, dim**-0.5)
        assert torch.equal(out[row], decoded[0]), row


def test_deterministic_steps_mark_no_generated_rows(tiny_model_dirs):
    """Deterministic mode attends every prompt row as a decode already: a replay's step carries no
    prompt lengths there, and in the default mode it does."""
    from lmiserve.rolling_batch.runner.step_inputs import build_step_arrays
    from lmiserve.wire import SamplingParams

    from .engine_helpers import make_engine

    engine = make_engine(tiny_model_dirs["llama"], enable_prefix_caching=False)
    engine.add_request("r", [5, 6, 7, 8], SamplingParams(max_new_tokens=8), output_ids=[9, 10])
    out = engine.scheduler.schedule()
    assert build_step_arrays(out, 16).prompt_lens.tolist() == [4]
    assert build_step_arrays(out, 16, mark_generated=False).prompt_lens is None
