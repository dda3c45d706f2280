"""The spec readers of the vision-language models whose language model the decoder runs (torch-free,
like :mod:`.spec`): the language model's spec from its ``text_config``, with the tower's family,
the image token and, for the Qwen families, the multimodal rotary sections."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .spec import ModelSpec, UnsupportedModel, _common, _gemma, _llama, _mistral, _qwen2, _qwen3

NO_TP = "vision-language models do not run tensor parallel yet"


def _llava(config: dict[str, Any]) -> ModelSpec:
    """LLaVA and LLaVA-NeXT: the language model of their ``text_config`` (Llama, Mistral or Qwen2)
    fed by a CLIP tower."""
    text_type = config.get("model_type", "llama")
    readers = {"llama": _llama, "mistral": _mistral, "qwen2": _qwen2}
    if text_type not in readers:
        raise UnsupportedModel(f"LLaVA over a {text_type} language model is not supported")
    whole = config.get("multimodal", config)
    return dataclasses.replace(
        readers[text_type](config),
        vision="llava_next" if "LlavaNextForConditionalGeneration" in whole["architectures"] else "llava",
        image_token_id=int(whole.get("image_token_index", whole.get("image_token_id", -1))),
        tp_refusal=NO_TP,
    )


def _sections(config: dict[str, Any]) -> tuple[int, ...]:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return tuple(int(n) for n in rope.get("mrope_section") or ())


def _qwen_vl(config: dict[str, Any]) -> ModelSpec:
    """Qwen2.5-VL and Qwen2-VL: a Qwen2 language model with multimodal rotary positions, fed by
    their own tower."""
    whole = config.get("multimodal", config)
    return dataclasses.replace(
        _common(config, "qwen2", qkv_bias=True),
        vision="qwen2_vl" if "Qwen2VLForConditionalGeneration" in whole["architectures"] else "qwen2_5_vl",
        image_token_id=int(whole.get("image_token_id", 151655)),
        mrope_section=_sections(config),
        tp_refusal=NO_TP,
    )


def _qwen3_vl(config: dict[str, Any]) -> ModelSpec:
    """Qwen3-VL: a Qwen3 language model with interleaved multimodal rotary sections, fed by its
    tower (whose DeepStack features add to the first layers' outputs)."""
    whole = config.get("multimodal", config)
    return dataclasses.replace(
        _qwen3(config),
        vision="qwen3_vl",
        image_token_id=int(whole.get("image_token_id", 151655)),
        mrope_section=_sections(config) or (24, 20, 20),
        mrope_interleaved=True,
        tp_refusal=NO_TP,
    )


def _gemma3_vision(config: dict[str, Any]) -> ModelSpec:
    """Gemma 3 with its SigLIP tower: the language model of its ``text_config``."""
    whole = config.get("multimodal", config)
    return dataclasses.replace(
        _gemma(config),
        vision="gemma3",
        image_token_id=int(whole.get("image_token_index", whole.get("image_token_id", 262144))),
        tp_refusal=NO_TP,
    )


VISION_SPEC_ARCHITECTURES: dict[str, Callable[[dict[str, Any]], ModelSpec]] = {
    "LlavaForConditionalGeneration": _llava,
    "LlavaNextForConditionalGeneration": _llava,
    "Qwen2_5_VLForConditionalGeneration": _qwen_vl,
    "Qwen2VLForConditionalGeneration": _qwen_vl,
    "Qwen3VLForConditionalGeneration": _qwen3_vl,
    "Gemma3ForConditionalGeneration": _gemma3_vision,
}
