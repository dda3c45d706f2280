"""The API process's count of a picture's tokens (torch-free) equals transformers' processors'."""

from __future__ import annotations

import pytest

from lmiserve.generation.vision_prompt import VisionPrompt
from lmiserve.media import DecodedImage
from tests.tiny_vision import IMAGE_TOKEN, build_llava, build_qwen_vl, picture

SIZES = [(100, 80), (30, 200), (500, 60), (56, 56), (448, 448), (57, 113)]


@pytest.fixture(scope="module", params=["llava", "llava-next", "qwen2.5-vl", "qwen3-vl"])
def model_dir(request, tmp_path_factory):
    if request.param == "qwen3-vl":
        from tests.tiny_qwen3_vl import build_qwen3_vl

        return build_qwen3_vl(tmp_path_factory.mktemp(request.param))
    if request.param == "qwen2.5-vl":
        return build_qwen_vl(tmp_path_factory.mktemp(request.param))
    return build_llava(tmp_path_factory.mktemp(request.param), next_=request.param == "llava-next")


def test_tokens_per_picture_equal_the_processors(model_dir):
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    if (model_dir / "processor_config.json").is_file():  # LLaVA: the whole processor widens the token
        processor = AutoProcessor.from_pretrained(model_dir)
        vision = VisionPrompt.of(model_dir, processor.tokenizer)
        assert vision is not None and vision.image_token == IMAGE_TOKEN
        for width, height in SIZES:
            ids = processor(images=[picture(0, width, height)], text=IMAGE_TOKEN, return_tensors="pt")["input_ids"][0]
            assert vision.tokens_for(width, height) == ids.tolist().count(vision.image_token_id), (width, height)
        return
    images = AutoImageProcessor.from_pretrained(model_dir)  # Qwen2.5-VL: one token per merged patch
    vision = VisionPrompt.of(model_dir, AutoTokenizer.from_pretrained(model_dir))
    assert vision is not None and vision.placeholder == "<|vision_start|><|image_pad|><|vision_end|>"
    for width, height in [*SIZES, (1000, 700), (20, 20)]:
        t, h, w = images(images=[picture(0, width, height)], return_tensors="pt")["image_grid_thw"][0].tolist()
        assert vision.tokens_for(width, height) == t * h * w // 4, (width, height)


def test_expand_widens_each_image_token_and_refuses_a_count_that_differs(model_dir):
    from lmiserve.errors import BadRequest

    vision = VisionPrompt.of(model_dir)
    t = vision.image_token_id
    pics = [DecodedImage(width=w, height=h, pixels=b"", digest=f"d{w}") for w, h in SIZES[:2]]
    ids, images = vision.expand([5, t, 6, t, 7], pics)
    first, second = (vision.tokens_for(w, h) for w, h in SIZES[:2])
    assert ids == [5] + [t] * first + [6] + [t] * second + [7]
    assert [(m.offset, m.length, m.digest) for m in images] == [(1, first, "d100"), (2 + first, second, "d30")]
    with pytest.raises(BadRequest, match="holds 1 image token"):
        vision.expand([5, t], pics)


def test_a_text_model_has_no_vision(tiny_llama_dir):
    assert VisionPrompt.of(tiny_llama_dir) is None


def test_gemma3_writes_each_picture_out_before_tokenizing(tmp_path):
    from transformers import AutoTokenizer

    from tests.tiny_gemma3_vision import build_gemma3

    model_dir = build_gemma3(tmp_path / "gemma3")
    vision = VisionPrompt.of(model_dir, AutoTokenizer.from_pretrained(model_dir))
    assert vision is not None and vision.placeholder == "<start_of_image>" and vision.tokens_for(640, 480) == 4
    assert vision.widen("a <start_of_image> b") == "a \n\n<start_of_image><image_soft_token><end_of_image>\n\n b"


def test_qwen_widens_video_tokens_by_the_video_grid_and_sizes_frames_within_its_budget(tmp_path):
    from lmiserve.generation.qwen_grid import QwenGrid
    from lmiserve.media import DecodedVideo

    rules = VisionPrompt.of(build_qwen_vl(tmp_path / "qwen"))
    assert rules.takes_video and (rules.video_token, rules.sampling.factor) == ("<|video_pad|>", 2)
    # the tiny model's video processor: 56 x 56 to 112 x 112 pixels a frame
    assert rules.frame_size(6, 64, 96) == (56, 84) and rules.frame_size(6, 480, 640) == (84, 112)
    clip = DecodedVideo(5, 84, 56, b"\0" * (5 * 84 * 56 * 3), 2.0, "d")
    pic = DecodedImage(60, 60, b"\0" * (60 * 60 * 3), "p")
    image, video = rules.image_token_id, rules.video_token_id
    ids, inputs = rules.expand([7, video, 8, image, 9], [pic, clip])  # media in part order, tokens in theirs
    n = 3 * 4 * 6 // 4  # 5 frames: 3 grid steps of 4 x 6 patches, merged by 2 x 2
    assert [(i.offset, i.length, i.frames, i.fps) for i in inputs] == [(1, n, 5, 2.0), (2 + n, 4, 0, 0.0)]
    assert ids == [7, *[video] * n, 8, *[image] * 4, 9]
    with pytest.raises(Exception, match="0 video token"):
        rules.expand([7, image], [pic, clip])
    # the default budget: 90% of 128000 tokens' pixels shared by the frames, at least 1.05 x the least
    grid = QwenGrid.of_video({}, QwenGrid())
    assert grid.frame_size(8, 1080, 1920) == (560, 1008) and grid.frame_size(768, 1080, 1920) == (336, 644)


def test_models_without_video_rules_take_none(tmp_path):
    from tests.tiny_qwen3_vl import build_qwen3_vl

    assert not VisionPrompt.of(build_llava(tmp_path / "llava")).takes_video
    qwen3 = VisionPrompt.of(build_qwen3_vl(tmp_path / "qwen3"))
    assert qwen3.family == "qwen3_vl" and qwen3.qwen.patch == 16 and not qwen3.takes_video
