"""Families that run on the generic decoder with a few declared differences: Phi-3/Phi-4,
OLMo 2 and Granite (read from their Hugging Face configs; torch-free, like :mod:`.spec`).

- Phi-3 and Phi-4 (``Phi3ForCausalLM``): Llama's layer with the QKV and gate/up projections
  stored fused (``qkv_proj``, ``gate_up_proj``), LongRoPE scaling, an optional sliding window.
- OLMo 2 (``Olmo2ForCausalLM``): RMSNorm after attention and after the MLP (on the branch's
  output, before it joins the residual; no input norm), and q/k RMSNorm over the whole q and k
  projections rather than per head.
- Granite (``GraniteForCausalLM``): Llama's layer with the embeddings, each branch's output, the
  softmax scale and the logits scaled by constants from the config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .spec import ModelSpec, UnsupportedModel, _common, _window


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return rope if isinstance(rope, dict) else {}


def _partial_rotary_factor(config: dict[str, Any]) -> float:
    factor = _rope(config).get("partial_rotary_factor", config.get("partial_rotary_factor"))
    return 1.0 if factor is None else float(factor)


def _phi3(config: dict[str, Any]) -> ModelSpec:
    if _partial_rotary_factor(config) != 1.0:
        raise UnsupportedModel(
            f"partial_rotary_factor {_partial_rotary_factor(config)} (rotary embeddings on part of each "
            "head, as in Phi-4-mini) is not supported; Phi-3 and Phi-4 with full rotary embeddings are"
        )
    # Phi-3's sliding window, where set, is a plain causal window like Mistral's
    return _common(
        config,
        "phi3",
        sliding_window=_window(config),
        tp_refusal="Phi-3 checkpoints store the QKV and gate/up projections fused, which is not split "
        "for tensor parallelism yet; serve with tensor_parallel_degree 1",
    )


def _olmo2(config: dict[str, Any]) -> ModelSpec:
    if config.get("attention_bias"):
        raise UnsupportedModel("OLMo 2 with attention_bias=true is not supported")
    return _common(
        config,
        "olmo2",
        qk_norm=True,
        qk_norm_scope="projection",
        norm_placement="post",
        tp_refusal="OLMo 2 normalises the whole q and k projections, which tensor parallelism would "
        "split over ranks; serve with tensor_parallel_degree 1",
    )


def _granite(config: dict[str, Any]) -> ModelSpec:
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise UnsupportedModel("Granite models with attention or MLP biases are not supported")
    return _common(
        config,
        "granite",
        embedding_multiplier=float(config.get("embedding_multiplier", 1.0)),
        residual_multiplier=float(config.get("residual_multiplier", 1.0)),
        attention_scale=float(config.get("attention_multiplier", 1.0)),
        logits_scaling=float(config.get("logits_scaling", 1.0)),
    )


VARIANT_ARCHITECTURES: dict[str, Callable[[dict[str, Any]], ModelSpec]] = {
    "Phi3ForCausalLM": _phi3,
    "Olmo2ForCausalLM": _olmo2,
    "GraniteForCausalLM": _granite,
}
