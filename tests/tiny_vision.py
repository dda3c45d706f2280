"""Tiny random vision-language checkpoints with real processor configurations, written by the
tests, and the pictures and references the tests compare with."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.tiny_models import build_tokenizer

IMAGE_TOKEN = "<image>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
    "</s>\n{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
"""A LLaVA-style template: an image part becomes ``<image>``, which the processor repeats once per
embedding."""


NEXT_PINPOINTS = [[56, 112], [112, 56], [112, 112], [56, 168]]
"""LLaVA-NeXT's grid resolutions for the tiny tower (56 px tiles): up to 2x2 tiles, or 1x3."""


def build_llava(
    out: Path, seed: int = 0, image_size: int = 56, patch: int = 14, next_: bool = False, **sizes: int
) -> Path:
    """A LLaVA-1.5 layout (or LLaVA-NeXT's, ``next_``): a Llama language model, a CLIP tower and a
    two-layer projector, saved as transformers saves it (``language_model.model.*``,
    ``vision_tower.*``), with its processor (CLIP or LLaVA-NeXT image processor, ``<image>`` token,
    chat template). ``sizes``: ``text_hidden``, ``text_layers``, ``vision_hidden``, ``vision_layers``
    (64, 2, 32 and 3 unless given)."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
        LlavaProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.chat_template = CHAT_TEMPLATE
    th, vh = sizes.get("text_hidden", 64), sizes.get("vision_hidden", 32)
    text = LlamaConfig(
        vocab_size=len(tok), hidden_size=th, intermediate_size=2 * th, num_hidden_layers=sizes.get("text_layers", 2),
        num_attention_heads=max(4, th // 64), num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=1,
        eos_token_id=2, pad_token_id=3,
    )  # fmt: skip
    vision = CLIPVisionConfig(
        hidden_size=vh, intermediate_size=2 * vh, num_hidden_layers=sizes.get("vision_layers", 3),
        num_attention_heads=max(4, vh // 64), image_size=image_size, patch_size=patch, projection_dim=32,
    )  # fmt: skip
    common = dict(
        text_config=text,
        vision_config=vision,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
    )
    torch.manual_seed(seed)
    crop = {"height": image_size, "width": image_size}
    if next_:
        pinpoints = [[p * image_size // 56 for p in pair] for pair in NEXT_PINPOINTS]
        LlavaNextForConditionalGeneration(
            LlavaNextConfig(**common, image_grid_pinpoints=pinpoints)
        ).eval().save_pretrained(out)
        images = LlavaNextImageProcessor(
            size={"shortest_edge": image_size}, crop_size=crop, image_grid_pinpoints=pinpoints
        )
        kind = LlavaNextProcessor
    else:
        LlavaForConditionalGeneration(LlavaConfig(**common)).eval().save_pretrained(out)
        images = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=crop)
        kind = LlavaProcessor
    processor = kind(
        image_processor=images, tokenizer=tok, patch_size=patch, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE,
    )  # fmt: skip
    processor.save_pretrained(out)
    return out


def picture(seed: int, width: int = 100, height: int = 80):
    """A random RGB picture (PIL), the same for the same seed."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(height, width, 3) * 255).astype("uint8"), "RGB")


def image_inputs(prompt_ids: list[int], pictures: list, image_token_id: int) -> list:
    """One ``wire.ImageInput`` per run of image tokens in ``prompt_ids``, in order."""
    from lmiserve.wire import ImageInput

    runs, start = [], None
    for i, t in enumerate([*prompt_ids, -1]):
        if t == image_token_id and start is None:
            start = i
        elif t != image_token_id and start is not None:
            runs.append((start, i - start))
            start = None
    assert len(runs) == len(pictures)
    return [
        ImageInput(
            offset=o,
            length=n,
            digest=hashlib.sha256(p.tobytes()).hexdigest() + str(p.size),
            width=p.width,
            height=p.height,
            pixels=p.tobytes(),
        )  # fmt: skip
        for (o, n), p in zip(runs, pictures)
    ]


def hf_llava_greedy(
    model_dir: Path, messages: list[dict] | str, pictures: list, max_new: int
) -> tuple[list[int], list[int]]:
    """``(prompt ids, greedy ids)`` of transformers' LLaVA for a conversation (or a raw prompt)
    and its pictures."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    prompt = (
        messages if isinstance(messages, str) else processor.apply_chat_template(messages, add_generation_prompt=True)
    )
    inputs = processor(images=pictures or None, text=prompt, return_tensors="pt")
    key = str(model_dir)
    if key not in _models:
        _models[key] = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    model = _models[key]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new, do_sample=False)
    ids = inputs["input_ids"][0].tolist()
    gen = out[0, len(ids) :].tolist()
    eos = model.generation_config.eos_token_id
    if eos in gen:
        gen = gen[: gen.index(eos) + 1]
    return ids, gen


_models: dict = {}


def png_bytes(image) -> bytes:
    import io

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}</s>\n{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def build_qwen_vl(
    out: Path,
    seed: int = 0,
    max_pixels: int = 224 * 224,
    v2: bool = False,
    video_max_pixels: int = 112 * 112,
    **sizes: int,
) -> Path:
    """A Qwen2.5-VL layout (or Qwen2-VL's, ``v2``): a Qwen2 language model with multimodal rotary
    positions (sections 2, 3 and 3 of its 8 frequencies), a 3-block tower (Qwen2.5-VL: 56 px windows
    and one full-attention block), its ``Qwen2VLImageProcessor`` and its video processor's bounds
    (frames of 56 x 56 to ``video_max_pixels``), saved as transformers saves them.
    ``sizes``: ``text_hidden``, ``text_layers``, ``vision_hidden``, ``vision_layers`` (64, 2, 32, 3 unless
    given; Qwen2.5-VL only)."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    tok.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
    tok.chat_template = QWEN_TEMPLATE
    tok.save_pretrained(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_TOKENS}
    th, vh = sizes.get("text_hidden", 64), sizes.get("vision_hidden", 32)
    half = th // max(4, th // 64) // 2
    section = [half // 4, 3 * half // 8, 3 * half // 8]  # Qwen's 16, 24, 24 of 64, scaled
    text = dict(
        vocab_size=len(tok), hidden_size=th, intermediate_size=2 * th, num_hidden_layers=sizes.get("text_layers", 2),
        num_attention_heads=max(4, th // 64),
        num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=3,
        rope_parameters={"rope_type": "default", "mrope_section": section, "rope_theta": 10000.0},
    )  # fmt: skip
    vision = dict(
        depth=sizes.get("vision_layers", 3), hidden_size=vh, intermediate_size=2 * vh, num_heads=max(4, vh // 64),
        out_hidden_size=th, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
    )  # fmt: skip
    if v2:
        vision = dict(
            depth=3, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, hidden_act="quick_gelu", patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2,
        )  # fmt: skip
    config_class, model_class = (
        (Qwen2VLConfig, Qwen2VLForConditionalGeneration)
        if v2
        else (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration)
    )
    config = config_class(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip
    torch.manual_seed(seed)
    model_class(config).eval().save_pretrained(out)
    Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=max_pixels).save_pretrained(out)
    video = {"size": {"shortest_edge": 56 * 56, "longest_edge": video_max_pixels}, "patch_size": 14, "merge_size": 2,
             "temporal_patch_size": 2, "video_processor_type": "Qwen2VLVideoProcessor"}  # fmt: skip
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
    return out


def qwen_prompt(model_dir: Path, parts: list) -> tuple[list[int], list]:
    """``(prompt ids, pictures)`` of a user turn of text and pictures (PIL) as the template and
    processor lay them out: each picture its run of ``<|image_pad|>``, one per merged patch."""
    from transformers import AutoImageProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    images = AutoImageProcessor.from_pretrained(model_dir)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    ids = tok("<s>user\n")["input_ids"]
    pictures = [p for p in parts if not isinstance(p, str)]
    for part in parts:
        if isinstance(part, str):
            ids += tok(part)["input_ids"]
            continue
        t, h, w = images(images=[part], return_tensors="pt")["image_grid_thw"][0].tolist()
        ids += [tok.convert_tokens_to_ids("<|vision_start|>")] + [pad] * (t * h * w // 4)
        ids += [tok.convert_tokens_to_ids("<|vision_end|>")]
    ids += tok("</s>\n<s>assistant\n")["input_ids"]
    return ids, pictures


def hf_qwen_greedy(model_dir: Path, ids: list[int], pictures: list, max_new: int) -> list[int]:
    """transformers' Qwen2.5-VL, Qwen2-VL or Qwen3-VL ``generate`` (greedy, fp32) for these ids and
    pictures (:func:`tests.tiny_video.hf_qwen_video_greedy`, which takes clips too)."""
    from tests.tiny_video import hf_qwen_video_greedy

    return hf_qwen_video_greedy(model_dir, ids, pictures, max_new)
