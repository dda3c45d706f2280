"""Qwen2.5-VL and Qwen2-VL on the engine: the (windowed) tower, the merged patches and the multimodal rotary
positions give transformers' greedy tokens, alone, chunked, and in a batch with text-only requests;
pictures and videos (frames attended within themselves, temporal positions spaced by the frame rate)."""

from __future__ import annotations

import pytest

from tests.tiny_video import clip, hf_qwen_video_greedy, video_prompt
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


# --- videos -------------------------------------------------------------------------------------

VIDEO_CASES = {
    "a video": ["What happens?", clip(5, 4, 56, 84)],
    "a picture, then a video": [picture(6, 70, 90), "then", clip(12, 6, 84, 56, fps=1.0)],
    "an odd number of frames": [clip(8, 3, 56, 56, fps=0.5), "Why?"],
}


@pytest.fixture(scope="module")
def video_references(qwen_dir):
    out = {}
    for name, parts in VIDEO_CASES.items():
        ids, media = video_prompt(qwen_dir, parts)
        out[name] = (ids, hf_qwen_video_greedy(qwen_dir, ids, media, 12), media)
    return out


def test_a_videos_patches_are_the_image_processors_for_each_frame(qwen_dir):
    """Frames A and B cut as the video processor lays them out: each temporal half of a patch is
    what the image processor makes of that frame alone (it repeats a picture to fill the patch)."""
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor

    from lmiserve.generation.qwen_grid import QwenGrid
    from lmiserve.rolling_batch.models.spec import read_config
    from lmiserve.rolling_batch.models.vision.qwen_video import QwenVideo
    from tests.tiny_video import media_inputs_for

    processor = AutoImageProcessor.from_pretrained(qwen_dir)
    config = read_config(qwen_dir)["multimodal"]
    video = QwenVideo.of(qwen_dir, config, QwenGrid.of(processor.to_dict()), processor.to_dict())
    c = clip(9, 2, 84, 56)
    patches, grid = video.patches(media_inputs_for(c))
    assert grid == (1, 4, 6)
    frames = np.frombuffer(c.pixels, dtype=np.uint8).reshape(2, 56, 84, 3)
    for half, frame in enumerate(frames):
        alone = processor(images=[Image.fromarray(frame)], return_tensors="pt")
        assert alone["image_grid_thw"].tolist() == [[1, 4, 6]]
        expected = alone["pixel_values"].view(24, 3, 2, 14 * 14)[:, :, 0]
        torch.testing.assert_close(patches.view(24, 3, 2, 14 * 14)[:, :, half], expected, rtol=0, atol=1e-5)


def test_each_video_prompt_alone_equals_transformers(qwen_dir, video_references):
    engine = make_engine(qwen_dir, max_num_batched_tokens=16)  # videos split over prompt chunks
    for name, (ids, expected, media) in video_references.items():
        assert _run(engine, {name: (ids, media)})[name] == expected, name
    assert engine.runner.images.encoded == 4


def test_videos_pictures_and_text_in_one_batch(qwen_dir, video_references, references):
    engine = make_engine(qwen_dir, max_num_batched_tokens=512)
    everything = {**video_references, "text only": references["text only"]}
    tokens = _run(engine, {name: (ids, media) for name, (ids, _, media) in everything.items()})
    for name, (_, expected, _) in everything.items():
        assert tokens[name] == expected, name
