"""The NPU backend end to end on the CPU, against a semantic fake of torch_npu.

The fake (tests/fakes/torch_npu) computes what torch_npu's documentation says each kernel
computes and refuses what the kernels refuse, recording every call; so these tests check our
use of layouts, cumulative versus per-sequence lengths, int32 tables and mask polarity, and
that the NPU ops give the reference backend's tokens.
"""

import sys

import pytest
import torch

from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.wire import SamplingParams

from .attention_calls import decode, prefill
from .engine_helpers import hf_greedy, make_engine, run
from .test_ops import LENGTHS, dense_attention, paged


@pytest.fixture
def npu_ops(fake_npu):
    from lmiserve.rolling_batch.ops.npu import NpuOps

    return NpuOps()


def calls(fake, name):
    return [kw for n, kw in fake.CALLS if n == name]


def test_torch_npu_is_not_imported_by_the_backend_module():
    sys.modules.pop("torch_npu", None)
    import lmiserve.rolling_batch.ops.npu  # noqa: F401

    assert "torch_npu" not in sys.modules


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (32, 8)])
def test_decode_matches_dense(npu_ops, fake_npu, heads, kv_heads):
    dim = 32
    k_cache, v_cache, tables, dense = paged(LENGTHS, kv_heads, dim, num_blocks=128, dtype=torch.float16)
    q = torch.randn(len(LENGTHS), heads, dim).half()
    out = decode(npu_ops, q, k_cache, v_cache, tables, torch.tensor(LENGTHS, dtype=torch.int32), dim**-0.5)
    for s, n in enumerate(LENGTHS):
        expected = dense_attention(q[s : s + 1], *dense[s], causal_offset=n - 1)
        assert torch.allclose(out[s : s + 1].double(), expected, atol=1e-2), n
    (call,) = calls(fake_npu, "npu_fused_infer_attention_score")
    # one query row per sequence, in the layout of the engine's steps (TND)
    assert call["input_layout"] == "TND" and call["query_shape"] == (len(LENGTHS), heads, dim)
    assert call["actual_seq_lengths"] == list(range(1, len(LENGTHS) + 1))
    assert call["actual_seq_lengths_kv"] == LENGTHS and call["block_table_dtype"] == torch.int32
    assert call["key_shape"] == (128, 16, kv_heads * dim) and call["num_key_value_heads"] == kv_heads


def test_chunked_prefill_over_a_cached_prefix(npu_ops, fake_npu):
    dim, heads, kv_heads = 32, 8, 2
    totals, chunks = [17, 129, 40, 16], [17, 1, 25, 16]
    k_cache, v_cache, tables, dense = paged(totals, kv_heads, dim, num_blocks=64, dtype=torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(chunks), heads, dim).bfloat16()
    out = prefill(npu_ops, q, k_cache, v_cache, tables, cu, torch.tensor(totals, dtype=torch.int32), dim**-0.5)
    for s, (total, n) in enumerate(zip(totals, chunks)):
        lo = int(cu[s])
        expected = dense_attention(q[lo : lo + n], *dense[s], causal_offset=total - n)
        assert torch.allclose(out[lo : lo + n].double(), expected, atol=2e-2), (total, n)
    (call,) = calls(fake_npu, "npu_fused_infer_attention_score")
    assert call["input_layout"] == "TND" and call["sparse_mode"] == 3 and call["mask_shape"] == (2048, 2048)
    assert call["actual_seq_lengths"] == [17, 18, 43, 59]  # cumulative query lengths
    assert call["actual_seq_lengths_kv"] == totals  # per-sequence KV lengths


def test_write_kv_drops_unstored_slots_and_passes_int32(npu_ops, fake_npu):
    k_cache = torch.zeros(4, 16, 2, 8)
    v_cache = torch.zeros(4, 16, 2, 8)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([5, -1, 40])
    npu_ops.write_kv(k, v, k_cache, v_cache, slots)
    ref_k, ref_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    ReferenceOps().write_kv(k, v, ref_k, ref_v, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    (call,) = calls(fake_npu, "npu_scatter_pa_kv_cache")
    assert call["slots"] == [5, 40] and call["slot_dtype"] == torch.int32 and call["cache_mode"] == "Norm"


@pytest.mark.parametrize("dim,interleaved", [(64, False), (128, False), (32, False), (32, True)])
def test_norm_activation_and_rotary_match_reference(npu_ops, fake_npu, dim, interleaved):
    ref = ReferenceOps()
    x, w = torch.randn(5, 3, dim), torch.randn(dim)
    for a, b in zip(npu_ops.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6)):
        assert torch.allclose(a, b, atol=1e-6)
    gu = torch.randn(5, 2 * dim)
    assert torch.allclose(npu_ops.swiglu(gu), ref.swiglu(gu))
    q, k = torch.randn(5, 4, dim), torch.randn(5, 2, dim)
    angle = torch.randn(5, dim // 2)
    if interleaved:
        angle = angle.repeat_interleave(2, dim=-1)
    else:
        angle = torch.cat((angle, angle), dim=-1)
    cos, sin = angle.cos(), angle.sin()
    got = npu_ops.rotary(q.clone(), k.clone(), cos, sin, interleaved)
    want = ref.rotary(q, k, cos, sin, interleaved)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want))
    fused = calls(fake_npu, "npu_apply_rotary_pos_emb")
    assert bool(fused) == (dim in (64, 128) and not interleaved)


def test_top_k_top_p(npu_ops, fake_npu):
    logits = torch.randn(4, 50)
    top_k = torch.tensor([3, 10, 1, 50])
    top_p = torch.tensor([0.9, 0.5, 1.0, 0.3])
    got = npu_ops.top_k_top_p(logits, top_k, top_p)
    want = ReferenceOps().top_k_top_p(logits, top_k, top_p)
    assert torch.equal(got.isinf(), want.isinf())
    assert calls(fake_npu, "npu_top_k_top_p")
    # a row without a k limit is beyond the fused kernel (k in 1..1024): the reference filter runs
    fake_npu.CALLS.clear()
    npu_ops.top_k_top_p(logits, torch.tensor([0, 5, 5, 5]), None)
    assert not calls(fake_npu, "npu_top_k_top_p")


def test_fp32_attention_runs_the_reference_ops(npu_ops, fake_npu):
    """The fused attention kernel takes fp16/bf16 only; an fp32 model attends with plain torch."""
    k_cache, v_cache, tables, dense = paged([5, 17], 2, 32, num_blocks=8)
    q = torch.randn(2, 4, 32)
    out = decode(npu_ops, q, k_cache, v_cache, tables, torch.tensor([5, 17], dtype=torch.int32), 32**-0.5)
    for s, n in enumerate([5, 17]):
        assert torch.allclose(out[s : s + 1].double(), dense_attention(q[s : s + 1], *dense[s], n - 1), atol=1e-5)
    assert not calls(fake_npu, "npu_fused_infer_attention_score")


def test_fp16_engine_on_npu_ops_gives_the_reference_tokens(fake_npu, tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs["llama"]
    prompts = [tiny_tokenizer(p)["input_ids"] for p in ("What is Deep Learning?", "The quick brown fox " * 6)]
    arrivals = {
        0: [("a", prompts[0], SamplingParams(max_new_tokens=10))],
        1: [("b", prompts[1], SamplingParams(max_new_tokens=8))],
    }
    results = {}
    for ops in ("reference", "npu"):
        engine = make_engine(model_dir, ops=ops, dtype="fp16", block_size=128, max_num_batched_tokens=16)
        results[ops], _, _ = run(engine, arrivals)
    assert results["npu"] == results["reference"]
    attention = calls(fake_npu, "npu_fused_infer_attention_score")
    # the whole step in one TND call per layer: decodes are sequences of one query row
    assert attention and all(c["input_layout"] == "TND" for c in attention)
    assert all(c["block_table_dtype"] == torch.int32 and c["block_size"] == 128 for c in attention)
    chunked = [c for c in attention if c["actual_seq_lengths"][-1] < max(c["actual_seq_lengths_kv"])]
    assert chunked  # a chunk continued a cached prefix: KV longer than its query rows
    mixed = [c for c in attention if c["actual_seq_lengths"][0] == 1 and c["actual_seq_lengths"][-1] > 2]
    assert mixed  # a decode and a prompt chunk in the same call


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_engine_on_npu_ops_gives_the_reference_tokens(fake_npu, arch, tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs[arch]
    prompts = [tiny_tokenizer(p)["input_ids"] for p in ("What is Deep Learning?", "The quick brown fox " * 6, "Hi")]
    arrivals = {
        0: [("a", prompts[0], SamplingParams(max_new_tokens=12))],
        2: [("b", prompts[1], SamplingParams(max_new_tokens=9)), ("c", prompts[2], SamplingParams(max_new_tokens=15))],
    }
    results = {}
    for ops in ("reference", "npu"):
        # block size 128 (the NPU's); a small step budget so the long prompt is prefilled in chunks
        engine = make_engine(model_dir, ops=ops, block_size=128, max_num_batched_tokens=16)
        results[ops], _, _ = run(engine, arrivals)
        assert engine.runner.ops.name == ops
    assert results["npu"] == results["reference"]
    for rid, prompt, n in zip("abc", prompts, (12, 9, 15)):
        assert results["npu"][rid][0] == hf_greedy(model_dir, prompt, n)
    # fp32: fused norms, activation and cache writes; attention by the reference (the kernel is fp16/bf16)
    assert calls(fake_npu, "npu_rms_norm") and calls(fake_npu, "npu_swiglu")
    assert calls(fake_npu, "npu_scatter_pa_kv_cache")
    assert not calls(fake_npu, "npu_fused_infer_attention_score")
