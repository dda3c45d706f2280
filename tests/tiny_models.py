"""Tiny random-weight models and a real (small, trained here) tokenizer for tests.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a built-in corpus, the
model is built from a config with seeded random weights.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "What is Deep Learning? Deep learning is a subfield of machine learning.",
    "The quick brown fox jumps over the lazy dog.",
    "Continuous batching lets new requests join the running batch at every step.",
    "Paged attention stores the key value cache in fixed-size blocks.",
    "Große Füchse springen über faule Hunde. Ça va très bien, merci!",
    "東京は日本の首都です。 😀 🚀 emoji and ünïcödé text.",
    "def handle(inputs):\n    return outputs\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def build_tokenizer(out: Path, vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return fast


def reference_model(model_dir: Path, dtype=None):
    """transformers' model of ``model_dir`` (fp32 unless ``dtype``), in eval mode, as the tests'
    reference. Models that cap their attention scores (Gemma 2) load with eager attention: some
    transformers versions run them through SDPA, which drops the cap and changes the tokens."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    config = json.loads((Path(model_dir) / "config.json").read_text())
    extra = {"attn_implementation": "eager"} if config.get("attn_logit_softcapping") else {}
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype or torch.float32, **extra).eval()


def build_model(out: Path, arch: str = "llama", seed: int = 0, **overrides):
    """A tiny random model directory (config, safetensors, tokenizer) of the given family."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer(out)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    if arch == "llama":
        from transformers import LlamaConfig

        config = LlamaConfig(**common)
    elif arch == "qwen2":
        from transformers import Qwen2Config

        config = Qwen2Config(**common)
    elif arch == "qwen3":
        from transformers import Qwen3Config

        common.setdefault("head_dim", 16)
        config = Qwen3Config(**common)
    elif arch in MOE_ARCHS:
        config = _moe_config(arch, common)
    elif arch == "phi3":
        from transformers import Phi3Config

        common.setdefault("original_max_position_embeddings", common["max_position_embeddings"])
        config = Phi3Config(**common)
    elif arch == "olmo2":
        from transformers import Olmo2Config

        config = Olmo2Config(**common)
    elif arch == "granite":
        from transformers import GraniteConfig

        config = GraniteConfig(**common)
    elif arch in ("gemma2", "gemma3"):
        config = _gemma_config(arch, common)
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if arch.startswith("gemma"):  # Gemma's norms start at zero (a factor of 1): make them matter
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.normal_(0.0, 0.5)
    model.save_pretrained(out)
    return out


MOE_ARCHS = ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe")
"""Mixture-of-experts families :func:`build_model` builds: 4 experts, the top 2 per token."""


def _moe_config(arch: str, common: dict):
    import transformers

    moe = dict(num_experts_per_tok=2)
    if arch == "mixtral":
        return transformers.MixtralConfig(**common, **moe, num_local_experts=4)
    moe.update(num_experts=4)
    if arch == "qwen3_moe":  # renormalised top k; layer 1 dense
        common.setdefault("head_dim", 16)
        return transformers.Qwen3MoeConfig(
            **common, **moe, moe_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1]
        )
    if arch == "qwen2_moe":  # a shared expert beside the routed ones
        return transformers.Qwen2MoeConfig(
            **common, **moe, moe_intermediate_size=48, shared_expert_intermediate_size=96, norm_topk_prob=False
        )
    return transformers.OlmoeConfig(**common, **moe, norm_topk_prob=False)


def _gemma_config(arch: str, common: dict):
    """Gemma 2 / Gemma 3 text, small enough that every feature bites on short prompts: four
    layers of sliding (window 8) and global attention, and (Gemma 2) caps the scores reach."""
    common = dict(common)
    common.setdefault("head_dim", 16)
    common.setdefault("num_hidden_layers", 4)
    common.setdefault("sliding_window", 8)
    common.setdefault("query_pre_attn_scalar", 4)
    common.setdefault("initializer_range", 0.1)  # scores large enough for the caps to change tokens
    if common["num_hidden_layers"] == 2:  # the callers' default: too few for both kinds twice
        common["num_hidden_layers"] = 4
    if arch == "gemma2":
        from transformers import Gemma2Config

        common.setdefault("attn_logit_softcapping", 2.0)
        common.setdefault("final_logit_softcapping", 3.0)
        return Gemma2Config(**common)
    from transformers import Gemma3TextConfig

    common.setdefault("sliding_window_pattern", 2)
    common.setdefault(
        "rope_parameters",
        {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )
    config = Gemma3TextConfig(**common)
    config.architectures = ["Gemma3ForCausalLM"]
    return config
