"""Qwen2.5-VL and Qwen2-VL on the engine: the (windowed) tower, the merged patches and the multimodal rotary
positions give transformers' greedy tokens, alone, chunked, and in a batch with text-only requests."""

from __future__ import annotations

import pytest

from tests.tiny_vision import build_qwen_vl, hf_qwen_greedy, picture, qwen_prompt

from .engine_helpers import make_engine, run_pictures

pytestmark = pytest.mark.usefixtures("scheduling")

CASES = {
    "one picture": ["What is this?", picture(1, 100, 80)],
    "two pictures": ["Compare", picture(2, 60, 130), "with", picture(3, 200, 90)],
    "a large picture": [picture(4, 448, 300), "Describe it."],
    "text only": ["The quick brown fox jumps over the lazy dog."],
}


@pytest.fixture(scope="module", params=["qwen2.5-vl", "qwen2-vl"])
def qwen_dir(request, tmp_path_factory):
    return build_qwen_vl(tmp_path_factory.mktemp(request.param), v2=request.param == "qwen2-vl")


@pytest.fixture(scope="module")
def references(qwen_dir):
    out = {}
    for name, parts in CASES.items():
        ids, pictures = qwen_prompt(qwen_dir, parts)
        out[name] = (ids, hf_qwen_greedy(qwen_dir, ids, pictures, 12), pictures)
    return out


def _run(engine, requests):
    return run_pictures(engine, requests, 12)


def test_each_prompt_alone_equals_transformers(qwen_dir, references):
    engine = make_engine(qwen_dir, max_num_batched_tokens=24)  # pictures split over prompt chunks
    for name, (ids, expected, pictures) in references.items():
        assert _run(engine, {name: (ids, pictures)})[name] == expected, name


def test_all_at_once_in_one_batch(qwen_dir, references):
    engine = make_engine(qwen_dir, max_num_batched_tokens=512)
    tokens = _run(engine, {name: (ids, pictures) for name, (ids, _, pictures) in references.items()})
    for name, (_, expected, _) in references.items():
        assert tokens[name] == expected, name
