"""Deterministic mode: in bf16 a request's tokens do not depend on the batch around it, on how
its prompt was chunked, or on whether its prefix came from the prefix cache."""

import random

import pytest
import torch

from lmiserve.rolling_batch.ops import select_ops
from lmiserve.rolling_batch.ops.batch_invariant import ROWS
from lmiserve.rolling_batch.ops.cpu_kernels import bf16_linear_kernel
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine, run

TARGET = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun"
PARAMS = {
    "greedy": SamplingParams(max_new_tokens=12),
    "seeded": SamplingParams(max_new_tokens=12, do_sample=True, seed=7, temperature=0.9, top_p=0.95),
}


def _engine(model_dir, budget=64, seqs=40):
    return make_engine(model_dir, dtype="bf16", deterministic=True, max_num_seqs=seqs, max_num_batched_tokens=budget)


def _others(n, vocab, seed):
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randrange(3, 70))] for _ in range(n)]


def _target_tokens(engine, prompt, params, others=(), warm=None):
    arrivals = {0: [(f"o{i}", p, SamplingParams(max_new_tokens=12)) for i, p in enumerate(others)]}
    arrivals[0].append(("t", prompt, params))
    if warm is not None:  # a request for the same prompt first: the target finds its prefix cached
        run(engine, {0: [("w", warm, SamplingParams(max_new_tokens=1))]})
    tokens, _, _ = run(engine, arrivals)
    return tokens["t"][0]


@pytest.mark.usefixtures("scheduling")
@pytest.mark.parametrize("kind", sorted(PARAMS))
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tokens_do_not_depend_on_batch_chunking_or_prefix_cache(arch, kind, tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs[arch]
    prompt = tiny_tokenizer(TARGET)["input_ids"]
    assert len(prompt) > 16  # more than one KV block, so the prefix cache can hold some of it
    params = PARAMS[kind]
    alone = _target_tokens(_engine(model_dir, budget=512), prompt, params)
    assert len(alone) == 12
    vocab = len(tiny_tokenizer)
    for size in (2, 8, 32):
        others = _others(size - 1, vocab, seed=size)
        assert _target_tokens(_engine(model_dir), prompt, params, others) == alone, f"batch of {size}"
    for budget in (16, 64, 512):
        assert _target_tokens(_engine(model_dir, budget=budget), prompt, params) == alone, f"budget {budget}"
    engine = _engine(model_dir, budget=16)
    assert _target_tokens(engine, prompt, params, warm=prompt) == alone
    assert engine.blocks.prefix_hit_tokens > 0


@pytest.mark.parametrize("ops_name", ["cpu", "reference"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_rows_product_is_the_same_bits_in_any_batch(ops_name, dtype):
    ops = select_ops("cpu", ops_name, deterministic=True)
    g = torch.Generator().manual_seed(0)
    w = ops.prepare_linear(torch.randn(576, 1536, generator=g).to(dtype))
    rows = torch.randn(70, 1536, generator=g).to(dtype)
    alone = ops.linear(rows[:1], w)
    for n in (2, ROWS - 1, ROWS, ROWS + 1, 70):
        batch = torch.cat([torch.randn(n - 1, 1536, generator=g).to(dtype), rows[:1]])
        assert torch.equal(ops.linear(batch, w)[-1:], alone), n


@pytest.mark.skipif(not bf16_linear_kernel(), reason="the bf16 linear kernel needs AVX512_BF16")
def test_the_cpu_ops_run_bf16_weights_whole_in_the_row_by_row_kernel():
    """Deterministic mode packs bf16 weights for the C++ kernel even where oneDNN is the default
    (AMX CPUs), and runs a step's rows in one product: a row of the fused SwiGLU gives the same
    bits alone as among 40 others, and the same bits as the plain product followed by SwiGLU."""
    ops = select_ops("cpu", "cpu", deterministic=True)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2 * 96, 64, generator=g).bfloat16()
    plain, gated = ops.prepare_linear(w), ops.prepare_gate_up(w)
    assert (plain.packing, gated.packing) == ("lmiserve", "lmiserve-gated")
    x = torch.randn(41, 64, generator=g).bfloat16()
    whole = ops.gate_up_swiglu(x, gated)
    assert torch.equal(ops.gate_up_swiglu(x[-1:], gated), whole[-1:])
    assert torch.equal(whole, ops.swiglu(ops.linear(x, plain)))
