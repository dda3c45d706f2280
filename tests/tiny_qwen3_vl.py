"""A tiny random Qwen3-VL written by the tests: a Qwen3 language model with interleaved multimodal
rotary sections, and a tower with learned positions and two DeepStack features."""

from __future__ import annotations

from pathlib import Path

from tests.tiny_models import build_tokenizer
from tests.tiny_vision import QWEN_TEMPLATE, QWEN_TOKENS


def build_qwen3_vl(out: Path, seed: int = 0) -> Path:
    """Saved as transformers saves it, with its ``Qwen2VLImageProcessor`` (16-pixel patches, Qwen3-VL's
    mean and deviation of 0.5)."""
    import torch
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    tok.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
    tok.chat_template = QWEN_TEMPLATE
    tok.save_pretrained(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_TOKENS}
    text = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
        pad_token_id=3, rope_parameters={"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True,
                                         "rope_theta": 10000.0},
    )  # fmt: skip
    vision = dict(
        depth=3, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=16, spatial_merge_size=2,
        temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16, deepstack_visual_indexes=[0, 2],
    )  # fmt: skip
    config = Qwen3VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # the learned positions at a visible scale, so a wrong resampling shows
        model.model.visual.pos_embed.weight.normal_(0, 1.0)
    model.save_pretrained(out)
    Qwen2VLImageProcessor(
        patch_size=16, merge_size=2, min_pixels=32 * 32, max_pixels=256 * 256, image_mean=[0.5] * 3, image_std=[0.5] * 3
    ).save_pretrained(out)
    return out
