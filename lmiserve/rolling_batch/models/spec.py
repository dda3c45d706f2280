"""What a model family needs from the generic decoder, read from a Hugging Face config."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class UnsupportedModel(ValueError):
    pass


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int = 0
    eos_token_ids: tuple[int, ...] = ()
    # mixture of experts (models/moe.py); num_experts 0: every MLP is dense
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    """The chosen experts' probabilities renormalised to sum to 1."""
    router_weights_rounded: bool = False
    """The routing weights cast to the model's dtype before they scale the experts (Qwen, OLMoE;
    Mixtral keeps them in fp32)."""
    shared_expert_intermediate_size: int = 0
    """A shared expert beside the routed ones, scaled by a sigmoid gate (Qwen2-MoE); 0: none."""
    dense_mlp_layers: tuple[int, ...] = ()
    """Layers whose MLP is dense (``intermediate_size`` wide) in a mixture-of-experts model."""
    moe_prefix: str = "mlp"
    """Where a layer's router and experts are named: ``mlp`` or Mixtral's ``block_sparse_moe``."""
    norm_placement: str = "pre"
    """"pre": RMSNorm before attention and the MLP (Llama); "post": after each, on the branch's
    output before it joins the residual, with no input norm (OLMo 2); "sandwich": both, four
    norms a layer (Gemma 2 and 3)."""
    qk_norm_scope: str = "head"
    """What q_norm/k_norm normalise: "head" (each head, Qwen3) or "projection" (the whole q and
    k projections, OLMo 2)."""
    embedding_multiplier: float = 1.0
    """Scales the token embeddings (Granite)."""
    residual_multiplier: float = 1.0
    """Scales each branch's output before it joins the residual (Granite)."""
    attention_scale: float = 0.0
    """The softmax scale; 0 means ``head_dim ** -0.5`` (Granite's attention_multiplier, Gemma's
    query_pre_attn_scalar ** -0.5)."""
    logits_scaling: float = 1.0
    """The logits are divided by this (Granite)."""
    tp_refusal: str = ""
    """Why this model cannot be split for tensor parallelism ("" when it can)."""
    layer_windows: tuple[int, ...] = ()
    """Each layer's sliding window (0: global attention) where layers differ; empty: every layer
    has ``sliding_window``."""
    attn_softcap: float = 0.0
    """Attention scores capped as ``tanh(s / c) * c`` before the softmax; 0: none."""
    final_softcap: float = 0.0
    """Logits capped likewise; 0: none."""
    vision: str = ""
    """The family of the vision tower that feeds images into the prompt (``llava``); "": text only."""
    image_token_id: int = -1
    """The placeholder token each image embedding takes the place of (-1: none)."""
    mrope_section: tuple[int, ...] = ()
    """Multimodal rotary positions (Qwen2-VL): how many of the head's rotary frequencies take the
    temporal, height and width position; empty: one position per token."""
    mrope_interleaved: bool = False
    """Qwen3-VL: the sections' frequencies interleaved (time, height, width, time, ...) rather than
    in three runs."""


def _eos(config: dict[str, Any]) -> tuple[int, ...]:
    eos = config.get("eos_token_id")
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)


def _common(
    config: dict[str, Any], architecture: str, activations: tuple[str, ...] = ("silu", "swish"), **extra: Any
) -> ModelSpec:
    heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    act = config.get("hidden_activation") or config.get("hidden_act") or activations[0]
    if act not in activations:
        raise UnsupportedModel(f"activation {act!r} is not supported")
    return ModelSpec(
        architecture=architecture,
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        eos_token_ids=_eos(config),
        **extra,
    )


def _window(config: dict[str, Any]) -> int:
    if config.get("use_sliding_window") is False:
        return 0
    window = config.get("sliding_window")
    return int(window) if window else 0


def _llama(config: dict[str, Any]) -> ModelSpec:
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise UnsupportedModel("Llama models with attention or MLP biases are not supported")
    return _common(config, "llama")


def _mistral(config: dict[str, Any]) -> ModelSpec:
    return _common(config, "mistral", sliding_window=_window(config))


def _qwen2(config: dict[str, Any]) -> ModelSpec:
    if config.get("use_sliding_window"):
        raise UnsupportedModel("Qwen2 with use_sliding_window=true is not supported")
    return _common(config, "qwen2", qkv_bias=True)


def _qwen3(config: dict[str, Any]) -> ModelSpec:
    if config.get("use_sliding_window"):
        raise UnsupportedModel("Qwen3 with use_sliding_window=true is not supported")
    return _common(config, "qwen3", qkv_bias=bool(config.get("attention_bias", False)), qk_norm=True)


def _dense_layers(config: dict[str, Any]) -> tuple[int, ...]:
    """Qwen-MoE's layers with a dense MLP: ``mlp_only_layers``, and those off ``decoder_sparse_step``."""
    only = set(config.get("mlp_only_layers") or [])
    step = int(config.get("decoder_sparse_step") or 1)
    return tuple(i for i in range(config["num_hidden_layers"]) if i in only or (i + 1) % step != 0)


def _num_experts(config: dict[str, Any]) -> int:
    """``num_experts`` (Qwen, OLMoE checkpoints) or ``num_local_experts`` (Mixtral, and what some
    transformers versions write for the others)."""
    return int(config.get("num_experts") or config["num_local_experts"])


def _mixtral(config: dict[str, Any]) -> ModelSpec:
    return _common(
        config,
        "mixtral",
        sliding_window=_window(config),
        num_experts=_num_experts(config),
        experts_per_token=int(config["num_experts_per_tok"]),
        moe_intermediate_size=config["intermediate_size"],
        norm_topk_prob=True,
        moe_prefix="block_sparse_moe",
    )


def _qwen_moe(config: dict[str, Any], architecture: str, **extra: Any) -> ModelSpec:
    if config.get("use_sliding_window"):
        raise UnsupportedModel(f"{architecture} with use_sliding_window=true is not supported")
    return _common(
        config,
        architecture,
        num_experts=_num_experts(config),
        experts_per_token=int(config["num_experts_per_tok"]),
        moe_intermediate_size=config["moe_intermediate_size"],
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        router_weights_rounded=True,
        dense_mlp_layers=_dense_layers(config),
        **extra,
    )


def _qwen2_moe(config: dict[str, Any]) -> ModelSpec:
    return _qwen_moe(
        config,
        "qwen2_moe",
        qkv_bias=bool(config.get("qkv_bias", True)),
        shared_expert_intermediate_size=int(config.get("shared_expert_intermediate_size") or 0),
    )


def _qwen3_moe(config: dict[str, Any]) -> ModelSpec:
    return _qwen_moe(config, "qwen3_moe", qkv_bias=bool(config.get("attention_bias", False)), qk_norm=True)


def _olmoe(config: dict[str, Any]) -> ModelSpec:
    if config.get("clip_qkv") is not None:
        raise UnsupportedModel("OLMoE with clip_qkv is not supported")
    return _common(
        config,
        "olmoe",
        qkv_bias=bool(config.get("attention_bias", False)),
        qk_norm=True,
        qk_norm_scope="projection",
        num_experts=_num_experts(config),
        experts_per_token=int(config["num_experts_per_tok"]),
        moe_intermediate_size=config["intermediate_size"],
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        router_weights_rounded=True,
    )


def _gemma(config: dict[str, Any]) -> ModelSpec:
    """Gemma 2 and Gemma 3 (text): sliding-window and global layers per ``layer_types``."""
    architecture = "gemma2" if "Gemma2ForCausalLM" in (config.get("architectures") or []) else "gemma3"
    if config.get("attention_bias"):
        raise UnsupportedModel("Gemma models with attention biases are not supported")
    if config.get("use_bidirectional_attention"):
        raise UnsupportedModel("Gemma models with bidirectional attention are not supported")
    layers = config["num_hidden_layers"]
    types = config.get("layer_types")
    if not types:  # the configuration classes' default: every pattern-th layer global
        pattern = 2 if architecture == "gemma2" else int(config.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UnsupportedModel(f"layer types {types} are not supported")
    window = int(config.get("sliding_window") or 0)
    # Gemma 3's attention in transformers never applies attn_logit_softcapping; Gemma 2's does
    attn_softcap = config.get("attn_logit_softcapping") if architecture == "gemma2" else None
    return _common(
        config,
        architecture,
        activations=("gelu_pytorch_tanh",),
        layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        attention_scale=float(config.get("query_pre_attn_scalar") or 256) ** -0.5,
        attn_softcap=float(attn_softcap or 0.0),
        final_softcap=float(config.get("final_logit_softcapping") or 0.0),
        qk_norm=architecture == "gemma3",
        norm_placement="sandwich",
    )


FAMILY_ARCHITECTURES: dict[str, Callable[[dict[str, Any]], ModelSpec]] = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _mistral,
    "Qwen2ForCausalLM": _qwen2,
    "Qwen3ForCausalLM": _qwen3,
    "MixtralForCausalLM": _mixtral,
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "Qwen2MoeForCausalLM": _qwen2_moe,
    "OlmoeForCausalLM": _olmoe,
    "Gemma2ForCausalLM": _gemma,
    "Gemma3ForCausalLM": _gemma,
}
"""The families read here; :mod:`.variants` and :mod:`.vision_specs` read more, :mod:`.architectures`
holds them all."""


VISION_ARCHITECTURES = (
    "LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
)
"""Vision-language models whose language model the decoder runs (their ``text_config``)."""


def read_config(model_dir: Path) -> dict[str, Any]:
    """config.json; for a vision-language model its language model's ``text_config``, with the
    whole configuration under ``multimodal`` and the top level's ``architectures``."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if not set(config.get("architectures") or ()) & set(VISION_ARCHITECTURES):
        return config
    text = config.get("text_config")
    if not isinstance(text, dict):  # the Hub's Qwen2.5-VL configs keep the language model's keys on top
        text = {k: v for k, v in config.items() if k != "vision_config"}
    return {**text, "architectures": config["architectures"], "multimodal": config}
