"""Tiny random vision-language checkpoints with real processor configurations, written by the
tests, and the pictures and references the tests compare with."""

from __future__ import annotations

import hashlib
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
