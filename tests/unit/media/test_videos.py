"""Videos decoded in the API process: the frames a model samples (transformers' Qwen2-VL rule
with ``fps``), each resized once to the model's frame size, from MP4, AVI and WMV files; and the
refusals, each naming the part."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from lmiserve.media import DecodedVideo, FrameSampling, MediaError, MediaPolicy, MediaRef, decode_video, resolve_media
from lmiserve.media.containers import video_format
from tests.tiny_video import video_bytes

from .conftest import encoded
from .conftest import picture as make_picture


def size_56(frames: int, height: int, width: int) -> tuple[int, int]:
    return 56, 84


@pytest.mark.parametrize(
    ("total", "fps", "expected"),
    [
        (10, 5.0, [0, 2, 5, 7]),  # 2 s at 2 frames a second: 4, which is also the least
        (300, 30.0, list(range(0, 300, 15))),  # 10 s: 20 frames
        (3, 30.0, [0, 1]),  # fewer frames than the least: all there are, an even number
        (100_000, 25.0, [int(i * 100_000 / 768) for i in range(768)]),  # the most
        (1, 30.0, []),
    ],
)
def test_frames_are_sampled_as_qwens_video_processor_samples_them(total, fps, expected):
    assert FrameSampling().indices(total, fps) == expected


@pytest.mark.parametrize("container", ["MP4", "AVI", "WMV"])
def test_each_container_gives_the_sampled_frames_at_the_models_size(container):
    data = video_bytes(container, frames=10, fps=5)
    assert video_format(data) == container
    video = decode_video(data, "inputs[0]", MediaPolicy(), FrameSampling(), size_56)
    assert isinstance(video, DecodedVideo)
    assert (video.frames, video.width, video.height, video.fps) == (4, 84, 56, 2.0)
    frames = np.frombuffer(video.pixels, dtype=np.uint8).reshape(4, 56, 84, 3)
    # frame i's bottom half is grey 20 * i (lossy codecs: within a few levels), its top half green
    assert np.abs(frames[:, 45, 40].astype(int) - np.array([[0], [40], [100], [140]])).max() <= 6
    assert (frames[:, 5, 40, 1] > 180).all()


def test_the_digest_follows_the_pixels_and_the_frame_rate():
    once = decode_video(video_bytes(frames=8, fps=4), "p", MediaPolicy(), FrameSampling(), size_56)
    again = decode_video(video_bytes(frames=8, fps=4), "p", MediaPolicy(), FrameSampling(), size_56)
    slower = decode_video(video_bytes(frames=8, fps=2), "p", MediaPolicy(), FrameSampling(), size_56)
    other = decode_video(video_bytes(frames=8, fps=4, seed=1), "p", MediaPolicy(), FrameSampling(), size_56)
    assert once.digest == again.digest
    assert len({once.digest, slower.digest, other.digest}) == 3


def refusal(data: bytes, policy: MediaPolicy | None = None) -> str:
    with pytest.raises(MediaError) as err:
        decode_video(data, "inputs[2]", policy or MediaPolicy(), FrameSampling(), size_56)
    return str(err.value)


def test_a_file_that_only_looks_like_a_video_is_not_one():
    fake = b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2mp41" + b"\x07" * 500
    assert refusal(fake).startswith("inputs[2]: not an MP4, AVI or WMV video (")


def test_a_video_of_one_frame_is_refused():
    assert (
        refusal(video_bytes(frames=1))
        == "inputs[2]: not an MP4, AVI or WMV video (1 frame(s): a video needs at least 2)"
    )


def test_frames_larger_than_the_image_limits_are_refused_before_decoding():
    message = refusal(video_bytes(width=64, height=48), MediaPolicy(max_image_side=32))
    assert message == "inputs[2]: video frames too large (64x48; at most 32 pixels a side and 67108864 a frame)"


def test_resolve_decodes_pictures_and_videos_in_order_and_leaves_videos_to_models_with_rules():
    clip = "data:video/mp4;base64," + base64.b64encode(video_bytes(frames=6, fps=3)).decode()
    picture = "data:image/png;base64," + base64.b64encode(encoded(make_picture(), "PNG")).decode()
    refs = [MediaRef("video", clip, "a"), MediaRef("image", picture, "b")]
    both = asyncio.run(resolve_media(refs, MediaPolicy(), video=(FrameSampling(), size_56)))
    assert [type(m).__name__ for m in both] == ["DecodedVideo", "DecodedImage"] and both[0].frames == 4
    assert [type(m).__name__ for m in asyncio.run(resolve_media(refs, MediaPolicy()))] == ["DecodedImage"]
    bad = [MediaRef("video", "data:video/mp4;base64," + base64.b64encode(b"RIFF....WAVE").decode(), "c")]
    with pytest.raises(MediaError, match="^c: not an MP4, AVI or WMV video"):
        asyncio.run(resolve_media(bad, MediaPolicy(), video=(FrameSampling(), size_56)))
