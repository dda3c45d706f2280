"""Qwen3-VL on the engine: its tower (learned positions resampled to each picture, whole-frame
attention), the DeepStack features added to the first layers' outputs at the picture's tokens, and
the interleaved multimodal rotary sections give transformers' greedy tokens, alone, chunked, and in
a batch with text-only requests."""

from __future__ import annotations

import pytest

from tests.tiny_qwen3_vl import build_qwen3_vl
from tests.tiny_vision import hf_qwen_greedy, picture, qwen_prompt

from .engine_helpers import make_engine, run_pictures

CASES = {
    "one picture": ["What is this?", picture(1, 100, 80)],
    "two pictures": ["Compare", picture(2, 64, 130), "with", picture(3, 200, 90)],
    "a large picture": [picture(4, 300, 260), "Describe it."],
    "text only": ["The quick brown fox jumps over the lazy dog."],
}


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return build_qwen3_vl(tmp_path_factory.mktemp("qwen3-vl"))


@pytest.fixture(scope="module")
def references(qwen3_dir):
    out = {}
    for name, parts in CASES.items():
        ids, pictures = qwen_prompt(qwen3_dir, parts)
        out[name] = (ids, hf_qwen_greedy(qwen3_dir, ids, pictures, 12), pictures)
    return out


def test_the_reference_depends_on_the_deepstack_features(qwen3_dir, references):
    """Without its DeepStack features the tiny model answers otherwise: the test below would see a
    decoder that drops them."""
    import torch
    from transformers import AutoModelForImageTextToText

    ids, expected, pictures = references["one picture"]
    model = AutoModelForImageTextToText.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    model.model.language_model._deepstack_process = lambda hidden, mask, embeds: hidden
    from transformers import AutoImageProcessor

    px = AutoImageProcessor.from_pretrained(qwen3_dir)(images=pictures, return_tensors="pt")
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, mm_token_type_ids=(input_ids == model.config.image_token_id).int(),
                             max_new_tokens=12, do_sample=False, **px)  # fmt: skip
    assert out[0, len(ids) :].tolist()[: len(expected)] != expected


@pytest.mark.parametrize("budget", [16, 512])
def test_each_prompt_alone_equals_transformers(qwen3_dir, references, budget):
    engine = make_engine(qwen3_dir, max_num_batched_tokens=budget)  # 16: pictures split over prompt chunks
    for name, (ids, expected, pictures) in references.items():
        assert run_pictures(engine, {name: (ids, pictures)}, 12)[name] == expected, name


def test_all_at_once_in_one_batch(qwen3_dir, references):
    engine = make_engine(qwen3_dir, max_num_batched_tokens=512)
    tokens = run_pictures(engine, {name: (ids, pictures) for name, (ids, _, pictures) in references.items()}, 12)
    for name, (_, expected, _) in references.items():
        assert tokens[name] == expected, name
