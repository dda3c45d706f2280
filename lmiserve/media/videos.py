"""Video bytes into the frames a model reads: the video stream decoded with PyAV (FFmpeg), the
frames a model samples picked (:class:`FrameSampling`), and each resized once, in the API process,
to the size the model's processor gives it, so the engine receives no more pixels than it uses.

The stream's size is checked before any frame is decoded (the image limits apply to each frame),
and only the sampled frames are converted and kept. A file FFmpeg cannot read, or one without a
video stream, is refused as not a video."""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image

from lmiserve.media.errors import MediaError, not_media
from lmiserve.media.policy import MediaPolicy

_WHAT = "an MP4, AVI or WMV video"
Sizer = Callable[[int, int, int], tuple[int, int]]
"""``(frames, height, width) -> (height, width)``: the model's frame size for a video."""


@dataclass(frozen=True)
class FrameSampling:
    """Which frames a model reads, as transformers' Qwen2-VL video processor samples them with
    ``fps`` given: ``fps`` frames a second of video, at least ``min_frames`` and at most
    ``max_frames`` (and never more than the video has), a multiple of ``factor`` (the temporal
    patch), spread evenly from the first frame."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    factor: int = 2

    def count(self, total: int, video_fps: float) -> int:
        most = math.floor(min(self.max_frames, total) / self.factor) * self.factor
        wanted = total / video_fps * self.fps if video_fps > 0 else total
        wanted = min(max(wanted, self.min_frames), most, total)
        return math.floor(wanted / self.factor) * self.factor

    def indices(self, total: int, video_fps: float) -> list[int]:
        """The frames read, in order (empty when the video is shorter than ``factor`` frames)."""
        n = self.count(total, video_fps)
        return [int(i * (total / n)) for i in range(n)] if n > 0 else []


@dataclass(frozen=True)
class DecodedVideo:
    frames: int
    width: int
    height: int
    pixels: bytes
    """The sampled frames, RGB, each row-major, ``frames * width * height * 3`` bytes."""
    fps: float
    """Sampled frames a second of video (what the model's temporal positions are spaced by)."""
    digest: str


def video_digest(frames: int, width: int, height: int, fps: float, pixels: bytes) -> str:
    h = hashlib.sha256(b"RGB video")
    h.update(b"%d %d %d %r" % (frames, width, height, fps))
    h.update(pixels)
    return h.hexdigest()


def decode_video(data: bytes, where: str, policy: MediaPolicy, sampling: FrameSampling, size: Sizer) -> DecodedVideo:
    """Raise :class:`MediaError` for anything but a readable video within the policy's frame size."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise not_media(where, _WHAT, "no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            _check_frame(width, height, where, policy)
            video_fps = float(stream.average_rate or stream.guessed_rate or 0)
            total = stream.frames or sum(1 for packet in container.demux(stream) if packet.size)
        picked = sampling.indices(total, video_fps)
        if not picked:
            raise not_media(where, _WHAT, f"{total} frame(s): a video needs at least {sampling.factor}")
        out_h, out_w = size(len(picked), height, width)
        frames = _frames(data, picked, (out_w, out_h))
    except MediaError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as e:
        raise not_media(where, _WHAT, str(e) or type(e).__name__) from None
    pixels = b"".join(frames)
    fps = len(picked) / total * video_fps if video_fps > 0 else sampling.fps
    return DecodedVideo(len(picked), out_w, out_h, pixels, fps, video_digest(len(picked), out_w, out_h, fps, pixels))


def _frames(data: bytes, picked: list[int], size: tuple[int, int]) -> list[bytes]:
    """The picked frames (by decode order), resized with Pillow's bicubic filter; a stream that
    ends early repeats its last frame for the indices past its end."""
    import av

    wanted = iter(picked)
    target = next(wanted)
    out: list[bytes] = []
    last: bytes | None = None
    with av.open(io.BytesIO(data), mode="r") as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i < target:
                continue
            last = _resized(frame.to_image(), size)
            while i >= target:
                out.append(last)
                target = next(wanted, -1)
                if target < 0:
                    return out
    if last is None:
        raise ValueError("no frame could be decoded")
    out.extend(last for _ in range(len(picked) - len(out)))
    return out


def _resized(image: Image.Image, size: tuple[int, int]) -> bytes:
    rgb = image.convert("RGB")
    if rgb.size != size:
        rgb = rgb.resize(size, Image.Resampling.BICUBIC)
    return rgb.tobytes()


def _check_frame(width: int, height: int, where: str, policy: MediaPolicy) -> None:
    if width <= 0 or height <= 0:
        raise not_media(where, _WHAT, f"frame size {width}x{height}")
    if max(width, height) > policy.max_image_side or width * height > policy.max_image_pixels:
        why = f"{width}x{height}; at most {policy.max_image_side} pixels a side and {policy.max_image_pixels} a frame"
        raise MediaError(where, f"video frames too large ({why})", reason="too_large")
