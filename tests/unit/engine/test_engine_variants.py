"""Phi-3, OLMo 2, Granite and Llama with scaled rotary embeddings: the engine's greedy output
equals transformers generate token for token (fp32, CPU ops), whole and chunked prompts and a
prefix-cache hit."""

from __future__ import annotations

import pytest
import torch

from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.rope import rope_tables
from lmiserve.rolling_batch.models.spec import UnsupportedModel
from lmiserve.rolling_batch.runner.sharding import check_shardable
from lmiserve.wire import SamplingParams

from .engine_helpers import _hf, hf_greedy, make_engine, run, staggered

HEAD_DIM = 16  # the tiny models' 64 hidden / 4 heads
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
    "long_factor": [1.5 + 0.7 * i for i in range(HEAD_DIM // 2)],
    "original_max_position_embeddings": 32,
}
VARIANTS = {
    "phi3": ("phi3", {}),
    "phi3-longrope": (
        "phi3",
        {"rope_scaling": LONGROPE, "original_max_position_embeddings": 32, "max_position_embeddings": 512},
    ),
    "olmo2": ("olmo2", {}),
    "granite": (
        "granite",
        {"embedding_multiplier": 6.0, "residual_multiplier": 0.3, "attention_multiplier": 0.4, "logits_scaling": 4.0},
    ),
    "llama-linear": ("llama", {"rope_scaling": {"type": "linear", "factor": 4.0}}),
    "llama-llama3": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "llama-yarn": (
        "llama",
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}},
    ),
}
TEXT = [
    "What is Deep Learning?",
    "Paged attention stores the key value cache in fixed-size blocks, and continuous batching "
    "lets new requests join the running batch at every step.",
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Hi",
]


def _randomise_norms(path, seed: int) -> None:
    """Norm weights away from transformers' ones, so a norm loaded wrongly shows."""
    import safetensors.torch

    file = path / "model.safetensors"
    tensors = safetensors.torch.load_file(str(file))
    g = torch.Generator().manual_seed(seed)
    for name, t in tensors.items():
        if "norm" in name:
            tensors[name] = 1.0 + 0.3 * torch.randn(t.shape, generator=g)
    safetensors.torch.save_file(tensors, str(file), metadata={"format": "pt"})


class _Dirs(dict):
    """The variants' model directories, each built when a test first asks for it."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, name):
        from tests.tiny_models import build_model

        arch, overrides = VARIANTS[name]
        self[name] = build_model(self.root / name, arch, seed=2, **overrides)
        _randomise_norms(self[name], 5)
        return self[name]


@pytest.fixture(scope="module")
def variant_dirs(tmp_path_factory):
    return _Dirs(tmp_path_factory.mktemp("variant-models"))


def _prompts(tok):
    return [tok(t)["input_ids"] for t in TEXT]


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("chunk", [256, 16])
def test_staggered_requests_match_generate(name, chunk, variant_dirs, tiny_tokenizer):
    model_dir = variant_dirs[name]
    engine = make_engine(model_dir, max_num_batched_tokens=chunk)
    prompts = _prompts(tiny_tokenizer)
    assert len(prompts[2]) > 32  # past LongRoPE's original length
    lengths = [20, 12, 25, 30]
    arrivals = staggered(prompts, lengths)
    tokens, _, _ = run(engine, arrivals)
    for rid, prompt, n in zip("abcd", prompts, lengths):
        if name == "phi3-longrope" and len(prompt) <= 32:
            # transformers: the short factors while a sequence stays within the original length,
            # then the long ones; here the long ones throughout (max_model_len > 32, see rope_tables)
            continue
        assert tokens[rid][0] == hf_greedy(model_dir, prompt, n), (name, rid)
    assert engine.blocks.num_used_blocks == 0


@pytest.mark.parametrize("name", ["phi3-longrope", "olmo2", "granite"])
def test_prefix_cache_hit_keeps_greedy_output(name, variant_dirs, tiny_tokenizer):
    model_dir = variant_dirs[name]
    engine = make_engine(model_dir, max_num_batched_tokens=64)
    system = _prompts(tiny_tokenizer)[2]
    prompts = [system + tiny_tokenizer(q)["input_ids"] for q in ("What is it?", "Why?")]
    arrivals = {0: [("r0", prompts[0], SamplingParams(max_new_tokens=10))]}
    arrivals[40] = [("r1", prompts[1], SamplingParams(max_new_tokens=10))]
    tokens, _, _ = run(engine, arrivals)
    assert engine.blocks.prefix_hit_tokens > 0
    for i, p in enumerate(prompts):
        assert tokens[f"r{i}"][0] == hf_greedy(model_dir, p, 10)


def test_longrope_short_factors_when_the_context_fits(variant_dirs, tiny_tokenizer):
    """max_model_len within original_max_position_embeddings: the short factors, as transformers
    uses for every sequence that stays within it."""
    model_dir = variant_dirs["phi3-longrope"]
    engine = make_engine(model_dir, max_model_len=32)
    prompt = _prompts(tiny_tokenizer)[0]
    n = 32 - len(prompt)
    tokens, _, _ = run(engine, {0: [("a", prompt, SamplingParams(max_new_tokens=n))]})
    assert tokens["a"][0] == hf_greedy(model_dir, prompt, n)


@pytest.mark.parametrize("name", ["phi3-longrope", "llama-linear", "llama-llama3", "llama-yarn"])
def test_rope_tables_are_transformers(name, variant_dirs):
    model_dir = variant_dirs[name]
    model = _hf(model_dir)
    arch = VARIANTS[name][0]
    cos, sin = rope_tables(model_dir, arch, 200)
    with torch.no_grad():
        ref_cos, ref_sin = model.model.rotary_emb(torch.zeros(1), torch.arange(200)[None])
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])
    if name == "phi3-longrope":
        short, _ = rope_tables(model_dir, arch, 32)
        assert not torch.allclose(short[1:], cos[1:32])  # long factors past the original length


def test_granite_logprobs_are_of_the_scaled_logits(variant_dirs, tiny_tokenizer):
    model_dir = variant_dirs["granite"]
    engine = make_engine(model_dir)
    prompt = _prompts(tiny_tokenizer)[1]
    _, _, deltas = run(engine, {0: [("a", prompt, SamplingParams(max_new_tokens=4, logprobs=1))]})
    got = [lp for d in deltas for lp in d.logprobs]
    ids = [t for d in deltas for t in d.token_ids]
    with torch.no_grad():
        logits = _hf(model_dir)(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    want = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(got), want, atol=1e-4)


def _config(arch: str, **extra):
    base = dict(
        architectures=[arch],
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return {**base, **extra}


def test_partial_rotary_and_tensor_parallel_refusals():
    with pytest.raises(UnsupportedModel, match="partial_rotary_factor"):
        spec_from_config(_config("Phi3ForCausalLM", partial_rotary_factor=0.75))
    with pytest.raises(UnsupportedModel, match="partial_rotary_factor"):
        spec_from_config(_config("Phi3ForCausalLM", rope_parameters={"partial_rotary_factor": 0.5}))
    for arch in ("Phi3ForCausalLM", "Olmo2ForCausalLM"):
        spec = spec_from_config(_config(arch))
        check_shardable(spec, 1)
        with pytest.raises(ValueError, match="tensor_parallel_degree 1"):
            check_shardable(spec, 2)
    check_shardable(spec_from_config(_config("GraniteForCausalLM")), 2)
    granite = spec_from_config(_config("GraniteForCausalLM", attention_multiplier=0.25, logits_scaling=8.0))
    assert (granite.attention_scale, granite.logits_scaling) == (0.25, 8.0)
