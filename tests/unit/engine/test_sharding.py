"""Tensor parallelism on the CPU, without processes: the sharding arithmetic, and the sharded
forward pass against the whole model."""

import pytest
import torch

from lmiserve.rolling_batch.models.spec import ModelSpec
from lmiserve.rolling_batch.quant.pieces import SKIP
from lmiserve.rolling_batch.quant.safetensors_weights import load_state_dict
from lmiserve.rolling_batch.runner.sharding import (
    Shard,
    check_shardable,
    head_range,
    kv_head_range,
    local_spec,
    shard_pieces,
    shard_state_dict,
)

from . import tp_helpers
from .engine_helpers import _hf


def spec(heads: int, kv: int, intermediate: int = 128, head_dim: int = 16) -> ModelSpec:
    return ModelSpec(
        architecture="llama",
        vocab_size=100,
        hidden_size=heads * head_dim,
        intermediate_size=intermediate,
        num_layers=1,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        qkv_bias=True,
    )


# --- sharding arithmetic --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("heads", "kv", "world", "queries", "kvs"),
    [
        (8, 8, 2, [(0, 4), (4, 4)], [(0, 4), (4, 4)]),  # multi-head
        (8, 2, 2, [(0, 4), (4, 4)], [(0, 1), (1, 1)]),  # GQA, one KV head each
        (8, 4, 2, [(0, 4), (4, 4)], [(0, 2), (2, 2)]),  # GQA, two KV heads each
        (4, 1, 2, [(0, 2), (2, 2)], [(0, 1), (0, 1)]),  # MQA: the KV head replicated
        (8, 2, 4, [(0, 2), (2, 2), (4, 2), (6, 2)], [(0, 1), (0, 1), (1, 1), (1, 1)]),  # replicated twice
    ],
)
def test_heads_are_split_and_kv_heads_follow_their_queries(heads, kv, world, queries, kvs):
    s = spec(heads, kv)
    shards = [Shard(r, world) for r in range(world)]
    assert [head_range(s, sh) for sh in shards] == queries
    assert [kv_head_range(s, sh) for sh in shards] == kvs
    group = heads // kv
    for (q0, qn), (k0, kn) in zip(queries, kvs):
        # every query head a rank computes reads a KV head that rank holds
        assert all(k0 <= h // group < k0 + kn for h in range(q0, q0 + qn))
    local = local_spec(s, shards[0])
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (queries[0][1], kvs[0][1], 128 // world)
    assert (local.hidden_size, local.head_dim, local.vocab_size) == (s.hidden_size, s.head_dim, s.vocab_size)


def test_shard_pieces_name_rows_and_columns():
    s = spec(8, 2, intermediate=64)  # head_dim 16, world 4: two query heads, one (replicated) KV head
    p = shard_pieces(s, Shard(3, 4))
    layer = "model.layers.5."
    assert p(layer + "self_attn.q_proj.weight") == (0, 96, 128) == p(layer + "self_attn.q_proj.bias")
    assert p(layer + "self_attn.k_proj.weight") == (0, 16, 32) == p(layer + "self_attn.v_proj.bias")
    assert p(layer + "self_attn.o_proj.weight") == (1, 96, 128)
    assert p(layer + "mlp.gate_proj.weight") == (0, 48, 64) == p(layer + "mlp.up_proj.weight")
    assert p(layer + "mlp.down_proj.weight") == (1, 48, 64)
    for replicated in ("model.embed_tokens.weight", "model.norm.weight", layer + "input_layernorm.weight"):
        assert p(replicated) is None
    assert p(layer + "self_attn.q_norm.weight") is None
    # the LM head and a row-parallel bias live on rank 0 only
    assert p("lm_head.weight") is None and p(layer + "self_attn.o_proj.bias") == SKIP
    assert shard_pieces(s, Shard(3, 4), lm_head=False)("lm_head.weight") == SKIP
    assert shard_pieces(s, Shard(0, 4))(layer + "self_attn.o_proj.bias") is None


@pytest.mark.parametrize(("heads", "kv", "world"), [(4, 2, 2), (4, 1, 2), (8, 2, 4), (4, 4, 4)])
def test_shards_put_together_are_the_whole_weights(heads, kv, world):
    s = spec(heads, kv, intermediate=32, head_dim=4)
    g = torch.Generator().manual_seed(0)
    hidden, d = s.hidden_size, s.head_dim
    full = {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(heads * d, hidden, generator=g),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(kv * d, hidden, generator=g),
        "model.layers.0.self_attn.v_proj.bias": torch.randn(kv * d, generator=g),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(hidden, heads * d, generator=g),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(32, hidden, generator=g),
        "model.layers.0.mlp.down_proj.weight": torch.randn(hidden, 32, generator=g),
        "model.norm.weight": torch.randn(hidden, generator=g),
        "lm_head.weight": torch.randn(100, hidden, generator=g),
    }
    shards = [shard_state_dict(full, shard_pieces(s, Shard(r, world), lm_head=r == 0)) for r in range(world)]
    a = "model.layers.0.self_attn."
    for name, dim in ((a + "q_proj.weight", 0), (a + "o_proj.weight", 1), ("model.layers.0.mlp.gate_proj.weight", 0)):
        assert torch.equal(torch.cat([sh[name] for sh in shards], dim=dim), full[name])
    assert torch.equal(
        torch.cat([sh["model.layers.0.mlp.down_proj.weight"] for sh in shards], dim=1),
        full["model.layers.0.mlp.down_proj.weight"],
    )
    for r, sh in enumerate(shards):
        k0, kn = kv_head_range(s, Shard(r, world))
        assert torch.equal(sh[a + "k_proj.weight"], full[a + "k_proj.weight"][k0 * d : (k0 + kn) * d])
        assert torch.equal(sh[a + "v_proj.bias"], full[a + "v_proj.bias"][k0 * d : (k0 + kn) * d])
        assert sh["model.norm.weight"] is full["model.norm.weight"]
        assert ("lm_head.weight" in sh) == (r == 0)
        assert all(t.is_contiguous() for t in sh.values())


def test_loading_a_shard_reads_what_sharding_the_whole_gives(tp_models):
    model_dir = tp_models["replicated"]
    s = tp_helpers.spec_of(model_dir)
    full = load_state_dict(model_dir, torch.float32)
    for rank in range(2):
        pieces = shard_pieces(s, Shard(rank, 2), lm_head=rank == 0)
        loaded = load_state_dict(model_dir, torch.float32, pieces=pieces)
        expected = shard_state_dict(full, pieces)
        assert loaded.keys() == expected.keys()
        assert all(torch.equal(loaded[n], expected[n]) for n in loaded)


@pytest.mark.parametrize(
    ("heads", "kv", "intermediate", "world", "message"),
    [
        (6, 6, 96, 4, "num_attention_heads 6 is not divisible by tensor_parallel_degree 4; "
         "degrees this model can be split over: 1, 2, 3, 6"),
        (12, 6, 128, 4, "num_key_value_heads 6 is not divisible by tensor_parallel_degree 4"),
        (12, 3, 128, 4, "tensor_parallel_degree 4 is not a multiple of num_key_value_heads 3, "
         "so the KV heads cannot be replicated evenly"),
        (8, 8, 100, 8, "intermediate_size 100 is not divisible by tensor_parallel_degree 8; "
         "degrees this model can be split over: 1, 2, 4"),
        (4, 2, 128, 0, "tensor_parallel_degree must be at least 1"),
    ],
)  # fmt: skip
def test_check_shardable_refuses_uneven_splits(heads, kv, intermediate, world, message):
    with pytest.raises(ValueError) as err:
        check_shardable(spec(heads, kv, intermediate), world)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(("heads", "kv", "world"), [(4, 2, 1), (7, 7, 1), (4, 2, 2), (4, 1, 2), (4, 2, 4), (8, 2, 8)])
def test_check_shardable_accepts_even_splits(heads, kv, world):
    check_shardable(spec(heads, kv), world)


# --- the sharded forward pass, ranks on threads ----------------------------------------------
@pytest.mark.parametrize("ops", ["reference", "cpu"])
@pytest.mark.parametrize(("layout", "world"), [("gqa", 2), ("replicated", 2), ("wide", 4), ("qwen3", 2)])
def test_sharded_forward_equals_the_whole_model(tp_models, layout, world, ops):
    model_dir = tp_models[layout]
    steps, prompt = tp_helpers.batch_steps(tp_helpers.spec_of(model_dir).vocab_size)
    whole = tp_helpers.sharded_logits(model_dir, 1, ops, steps)
    sharded = tp_helpers.sharded_logits(model_dir, world, ops, steps)
    for w, s in zip(whole, sharded):
        torch.testing.assert_close(s, w, atol=2e-5, rtol=1e-4)
    # and the whole model is transformers' (the first prompt's rows of the first step)
    with torch.no_grad():
        expected = _hf(model_dir)(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(whole[0][:20], expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("ops", ["reference", "cpu"])  # cpu: the fused bf16 kernels on shard-sized inputs
@pytest.mark.parametrize(("layout", "world"), [("gqa", 2), ("replicated", 2), ("wide", 4)])
def test_sharded_forward_in_bf16_stays_within_bf16_rounding(tp_models, layout, world, ops):
    model_dir = tp_models[layout]
    steps, _ = tp_helpers.batch_steps(tp_helpers.spec_of(model_dir).vocab_size)
    exact = tp_helpers.sharded_logits(model_dir, 1, ops, steps)
    sharded = tp_helpers.sharded_logits(model_dir, world, ops, steps, torch.bfloat16)
    for e, s in zip(exact, sharded):  # logits of about 0.6: a misplaced head or bias is off by 0.1 and more
        torch.testing.assert_close(s, e, atol=2e-2, rtol=0)
