"""Videos for the tests: files written by PyAV in each container MindIE names, and sampled clips
with the transformers reference of a Qwen2-VL / Qwen2.5-VL prompt that holds them."""

from __future__ import annotations

import io
from pathlib import Path

CONTAINERS = {"MP4": ("mp4", "mpeg4"), "AVI": ("avi", "mpeg4"), "WMV": ("asf", "wmv2")}


def video_bytes(
    container: str = "MP4", frames: int = 10, width: int = 64, height: int = 48, fps: int = 5, seed: int = 0
) -> bytes:
    """A video file: frame ``i``'s bottom half is grey ``20 * i`` (its top half green, with a blue
    that ``seed`` picks), so a sampled frame's index can be read back from its pixels."""
    import av
    import numpy as np

    fmt, codec = CONTAINERS[container]
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        rng = np.random.RandomState(seed)
        for i in range(frames):
            a = np.full((height, width, 3), 20 * i % 256, np.uint8)
            a[: height // 2] = (0, 200, rng.randint(0, 255))
            for packet in stream.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def clip(seed: int, frames: int, width: int, height: int, fps: float = 2.0):
    """Sampled frames as the API process hands them on (random pixels, already at the model's frame
    size: multiples of 28): a :class:`~lmiserve.media.DecodedVideo`."""
    import numpy as np

    from lmiserve.media.videos import DecodedVideo, video_digest

    pixels = (np.random.RandomState(seed).rand(frames, height, width, 3) * 255).astype("uint8").tobytes()
    return DecodedVideo(frames, width, height, pixels, fps, video_digest(frames, width, height, fps, pixels))


def video_prompt(model_dir: Path, parts: list) -> tuple[list[int], list]:
    """``(prompt ids, media)`` of a Qwen user turn of text, pictures (PIL) and clips, laid out as its
    processor lays them out: a picture's run of ``<|image_pad|>``, a clip's of ``<|video_pad|>``
    (one a merged patch of each pair of frames)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    images = AutoImageProcessor.from_pretrained(model_dir)
    start, end = tok.convert_tokens_to_ids("<|vision_start|>"), tok.convert_tokens_to_ids("<|vision_end|>")
    ids = tok("<s>user\n")["input_ids"]
    media = []
    for part in parts:
        if isinstance(part, str):
            ids += tok(part)["input_ids"]
            continue
        media.append(part)
        if hasattr(part, "frames"):
            count = -(-part.frames // 2) * (part.height // 14) * (part.width // 14) // 4
            ids += [start] + [tok.convert_tokens_to_ids("<|video_pad|>")] * count + [end]
        else:
            t, h, w = images(images=[part], return_tensors="pt")["image_grid_thw"][0].tolist()
            ids += [start] + [tok.convert_tokens_to_ids("<|image_pad|>")] * (t * h * w // 4) + [end]
    ids += tok("</s>\n<s>assistant\n")["input_ids"]
    return ids, media


def media_inputs(prompt_ids: list[int], media: list, image_token_id: int, video_token_id: int) -> list:
    """One ``wire.ImageInput`` per run of image or video tokens of ``prompt_ids``, in order."""
    from lmiserve.wire import ImageInput
    from tests.tiny_vision import image_inputs

    out, at = [], 0
    for item in media:
        token = video_token_id if hasattr(item, "frames") else image_token_id
        offset = prompt_ids.index(token, at)
        length = next((i for i, t in enumerate(prompt_ids[offset:]) if t != token), len(prompt_ids) - offset)
        if hasattr(item, "frames"):
            out.append(ImageInput(offset=offset, length=length, digest=item.digest, width=item.width,
                                  height=item.height, pixels=item.pixels, frames=item.frames, fps=item.fps))  # fmt: skip
        else:
            [picture] = image_inputs([image_token_id] * length, [item], image_token_id)
            out.append(ImageInput(**{**{f: getattr(picture, f) for f in picture.__struct_fields__}, "offset": offset}))
        at = offset + length
    return out


def hf_qwen_video_greedy(model_dir: Path, ids: list[int], media: list, max_new: int) -> list[int]:
    """transformers' Qwen2.5-VL (or Qwen2-VL) ``generate`` (greedy, fp32) for these ids, pictures
    and clips (the clips' patches as :class:`QwenVideo` cuts them, which a test holds to the image
    processor's)."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    from lmiserve.generation.qwen_grid import QwenGrid
    from lmiserve.rolling_batch.models.spec import read_config
    from lmiserve.rolling_batch.models.vision.qwen_video import QwenVideo
    from tests.tiny_vision import _models

    key = str(model_dir)
    if key not in _models:
        _models[key] = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    model = _models[key]
    processor = AutoImageProcessor.from_pretrained(model_dir)
    config = read_config(model_dir).get("multimodal") or read_config(model_dir)
    video = QwenVideo.of(model_dir, config, QwenGrid.of(processor.to_dict()), processor.to_dict())
    input_ids = torch.tensor([ids])
    extra: dict = {}
    pictures = [m for m in media if not hasattr(m, "frames")]
    clips = [m for m in media if hasattr(m, "frames")]
    if pictures:
        px = processor(images=pictures, return_tensors="pt")
        extra.update(pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"])
    if clips:
        cut = [video.patches(media_inputs_for(c)) for c in clips]
        extra.update(
            pixel_values_videos=torch.cat([p for p, _ in cut]), video_grid_thw=torch.tensor([g for _, g in cut])
        )
        if video.tokens_per_second is not None:
            extra["second_per_grid_ts"] = torch.tensor([2 / c.fps for c in clips])
    mm = (input_ids == model.config.image_token_id).int() + 2 * (input_ids == model.config.video_token_id).int()
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, mm_token_type_ids=mm, max_new_tokens=max_new, do_sample=False, **extra
        )
    gen = out[0, len(ids) :].tolist()
    eos = model.generation_config.eos_token_id
    return gen[: gen.index(eos) + 1] if eos in gen else gen


def media_inputs_for(c) -> object:
    """A clip as the engine's ``ImageInput`` (its place in a prompt aside)."""
    from lmiserve.wire import ImageInput

    return ImageInput(offset=0, length=0, digest=c.digest, width=c.width, height=c.height, pixels=c.pixels,
                      frames=c.frames, fps=c.fps)  # fmt: skip
