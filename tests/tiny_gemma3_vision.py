"""A tiny random Gemma 3 with vision (SigLIP tower, pooled picture tokens), written by the tests, and
transformers' greedy tokens for it."""

from __future__ import annotations

from pathlib import Path

from tests.tiny_models import build_tokenizer
from tests.tiny_vision import CHAT_TEMPLATE, _models

GEMMA_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]


def build_gemma3(out: Path, seed: int = 0) -> Path:
    """A Gemma 3 vision layout: a 2-layer Gemma 3 language model (a sliding layer of window 8, then
    a global one), a 2-layer SigLIP tower at 56 px, its patches pooled to 4 tokens a picture, and its
    ``Gemma3ImageProcessor``; the tokenizer knows ``<start_of_image>``, ``<end_of_image>`` and
    ``<image_soft_token>``, and its template writes ``<start_of_image>`` for a picture."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    tok.add_special_tokens({"additional_special_tokens": GEMMA_TOKENS})
    tok.chat_template = CHAT_TEMPLATE.replace("<image>", "<start_of_image>")
    tok.save_pretrained(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in GEMMA_TOKENS}
    config = Gemma3Config(
        text_config=dict(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"], bos_token_id=1, eos_token_id=2, pad_token_id=3,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=56, patch_size=14
        ),
        mm_tokens_per_image=4, boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # transformers starts the projection at zero: the pictures would not matter
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.5)
    model.save_pretrained(out)
    Gemma3ImageProcessor(size={"height": 56, "width": 56}).save_pretrained(out)
    return out


def gemma3_prompt(model_dir: Path, text: str, pictures: int) -> list[int]:
    """The ids of ``text`` in which each ``<start_of_image>`` is written out as Gemma 3's processor
    writes it (``\\n\\n<start_of_image>``, 4 soft tokens, ``<end_of_image>\\n\\n``)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    full = "\n\n<start_of_image>" + "<image_soft_token>" * 4 + "<end_of_image>\n\n"
    assert text.count("<start_of_image>") == pictures
    return tok(text.replace("<start_of_image>", full))["input_ids"]


def hf_gemma3_greedy(
    model_dir: Path, ids: list[int], pictures: list, max_new: int, bidirectional: bool = True
) -> list[int]:
    """transformers' Gemma 3 ``generate`` (greedy, fp32), the pictures' tokens attending to each
    other both ways (``token_type_ids``) unless ``bidirectional`` is False."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    key = str(model_dir)
    if key not in _models:
        _models[key] = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    model = _models[key]
    input_ids = torch.tensor([ids])
    extra: dict = {}
    if pictures:
        extra["pixel_values"] = AutoImageProcessor.from_pretrained(model_dir)(images=pictures, return_tensors="pt")[
            "pixel_values"
        ]
        if bidirectional:
            extra["token_type_ids"] = (input_ids == model.config.image_token_index).long()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, max_new_tokens=max_new, do_sample=False, **extra)
    gen = out[0, len(ids) :].tolist()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    for i, t in enumerate(gen):
        if t in eos:
            return gen[: i + 1]
    return gen
