"""How a vision-language model's prompt holds its pictures, read from the model's own files
(torch-free, for the API process): the image token a chat template or a prompt writes once per
picture, and how many of them the model's processor makes of it.

The API process tokenizes the prompt, then widens each image token into the run of placeholder
tokens the picture's embeddings will fill (what the model's processor does to the text), so the
prompt's token count, its limits and ``usage.prompt_tokens`` include the pictures' tokens, as the
peers count them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadRequest
from ..media.videos import FrameSampling
from ..wire import ImageInput
from .anyres import feature_count
from .qwen_grid import QwenGrid

FAMILIES = {
    "LlavaForConditionalGeneration": "llava",
    "LlavaNextForConditionalGeneration": "llava_next",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Gemma3ForConditionalGeneration": "gemma3",
}
"""The vision-language architectures whose prompts are read here, and their families."""


@dataclass(frozen=True)
class VisionPrompt:
    family: str
    image_token: str
    """The text a prompt holds once per picture (LLaVA's ``<image>``)."""
    image_token_id: int
    tokens_per_image: int
    """A picture's tokens, or (LLaVA-NeXT) those of the whole picture at tile size."""
    pinpoints: tuple[tuple[int, int], ...] = ()
    """LLaVA-NeXT's grid resolutions (``image_grid_pinpoints``); empty: every picture the same."""
    tile: int = 0
    side: int = 0
    qwen: QwenGrid | None = None
    """Qwen2.5-VL's grid: a picture's tokens by its resized area."""
    placeholder: str = ""
    """What a prompt no chat template rendered gets for each picture ("": ``image_token``)."""
    surround: tuple[str, str] = ("", "")
    """Gemma 3: each ``surround[0]`` (``<start_of_image>``, what its template writes) becomes
    ``surround[1]`` in the text before tokenization, as its processor does."""
    video_token: str = ""
    """The text a prompt holds once per video ("": the model takes no video)."""
    video_token_id: int = -1
    video_grid: QwenGrid | None = None
    sampling: FrameSampling | None = None
    """The frames the model reads of a video."""
    video_placeholder: str = ""

    @classmethod
    def of(cls, model_dir: Path, tokenizer: Any = None) -> VisionPrompt | None:
        """The model's rules, or None for a model that reads text only."""
        path = Path(model_dir)
        config = _json(path / "config.json")
        architectures = config.get("architectures") or []
        family = FAMILIES.get(architectures[0]) if architectures else None
        if family is None:
            return None
        if family in ("qwen2_5_vl", "qwen2_vl", "qwen3_vl"):
            return cls._qwen(path, family, config, tokenizer)
        if family == "gemma3":
            return cls._gemma3(config, tokenizer)
        vision = config.get("vision_config") or {}
        tile = int(vision.get("image_size", 336))
        side = tile // int(vision.get("patch_size", 14))
        strategy = config.get("vision_feature_select_strategy", "default")
        token_id = int(config.get("image_token_index", config.get("image_token_id", 32000)))
        processor = _json(path / "processor_config.json")
        token = processor.get("image_token") or "<image>"
        if tokenizer is not None:
            token = tokenizer.convert_ids_to_tokens(token_id) or token
        pinpoints = tuple(tuple(p) for p in config.get("image_grid_pinpoints") or ()) if family == "llava_next" else ()
        return cls(family, token, token_id, side * side + (strategy == "full"), pinpoints, tile, side)

    @classmethod
    def _qwen(cls, path: Path, family: str, config: dict[str, Any], tokenizer: Any) -> VisionPrompt:
        """Qwen2.5-VL, Qwen2-VL and Qwen3-VL: ``<|image_pad|>`` between ``<|vision_start|>`` and
        ``<|vision_end|>``; videos for Qwen2-VL and Qwen2.5-VL (Qwen3-VL's are not taken yet)."""
        token_id, video_id = int(config.get("image_token_id", 151655)), int(config.get("video_token_id", 151656))
        ends = [config.get("vision_start_token_id", 151652), config.get("vision_end_token_id", 151653)]
        token, video, start, end = "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"
        if tokenizer is not None:
            token, video, start, end = (tokenizer.convert_ids_to_tokens(int(i)) for i in (token_id, video_id, *ends))
        grid = QwenGrid.of(_json(path / "preprocessor_config.json"))
        if family == "qwen3_vl":
            return cls(family, token, token_id, 0, qwen=grid, placeholder=start + token + end)
        video_grid = QwenGrid.of_video(_json(path / "video_preprocessor_config.json"), grid)
        return cls(
            family, token, token_id, 0, qwen=grid, placeholder=start + token + end, video_token=video,
            video_token_id=video_id, video_grid=video_grid, sampling=FrameSampling(factor=video_grid.temporal),
            video_placeholder=start + video + end,
        )  # fmt: skip

    @classmethod
    def _gemma3(cls, config: dict[str, Any], tokenizer: Any) -> VisionPrompt:
        """Gemma 3: ``<start_of_image>`` widened to ``\n\n<start_of_image>``, the soft tokens and
        ``<end_of_image>\n\n``; a fixed number of tokens a picture (pan and scan is not done)."""
        token_id = int(config.get("image_token_index", config.get("image_token_id", 262144)))
        ends = [config.get("boi_token_index", 255999), config.get("eoi_token_index", 256000)]
        token, boi, eoi = "<image_soft_token>", "<start_of_image>", "<end_of_image>"
        if tokenizer is not None:
            token, boi, eoi = (tokenizer.convert_ids_to_tokens(int(i)) for i in (token_id, *ends))
        count = int(config.get("mm_tokens_per_image", 256))
        return cls("gemma3", token, token_id, count, placeholder=boi, surround=(boi, f"\n\n{boi}{token}{eoi}\n\n"))

    def widen(self, prompt: str) -> str:
        """The prompt's text with each picture's marker written out (Gemma 3); others unchanged."""
        marker, sequence = self.surround
        return prompt.replace(marker, sequence) if marker else prompt

    @property
    def takes_video(self) -> bool:
        return self.video_grid is not None

    def frame_size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """The size the model reads a video's frames at."""
        assert self.video_grid is not None
        return self.video_grid.frame_size(frames, height, width)

    def tokens_for(self, width: int, height: int, frames: int = 0) -> int:
        """The placeholder tokens of a picture of this size, or (``frames`` > 0) of a video."""
        if frames:
            assert self.video_grid is not None
            return self.video_grid.tokens(width, height, frames)
        if self.qwen is not None:
            if max(width, height) > 200 * min(width, height):
                raise BadRequest(f"a {width}x{height} picture: this model takes pictures of aspect ratio up to 200")
            return self.qwen.tokens(width, height)
        if not self.pinpoints:
            return self.tokens_per_image
        return feature_count(height, width, self.pinpoints, self.tile, self.side, self.tokens_per_image)

    def expand(self, prompt_ids: list[int], media: list[Any]) -> tuple[list[int], list[ImageInput]]:
        """Each image (video) token of ``prompt_ids`` widened into its picture's (video's) run of
        placeholders, and the media (decoded, with ``width``, ``height``, ``pixels``, ``digest``;
        a video's ``frames`` and ``fps`` too) as the engine takes them, in the prompt's order.
        Refused when the prompt's tokens and the media of each kind differ in number."""
        kinds = {self.image_token_id: ("image", self.image_token)}
        if self.takes_video:
            kinds[self.video_token_id] = ("video", self.video_token)
        queues: dict[str, list[Any]] = {"image": [], "video": []}
        for item in media:
            queues["video" if getattr(item, "frames", 0) else "image"].append(item)
        for token_id, (kind, text) in kinds.items():
            found = prompt_ids.count(token_id)
            if found != len(queues[kind]):
                raise BadRequest(
                    f"the prompt holds {found} {kind} token(s) ({text}) for {len(queues[kind])} {kind}(s); "
                    f"send each {kind} as a content part and do not write the {kind} token in the text"
                )
        if queues["video"] and not self.takes_video:
            raise BadRequest(f"this model takes no video ({len(queues['video'])} sent)")
        if not media:
            return prompt_ids, []
        ids: list[int] = []
        out = []
        pending = {kind: iter(items) for kind, items in queues.items()}
        for t in prompt_ids:
            if t not in kinds:
                ids.append(t)
                continue
            p = next(pending[kinds[t][0]])
            frames = getattr(p, "frames", 0)
            length = self.tokens_for(p.width, p.height, frames)
            extra = {"frames": frames, "fps": p.fps} if frames else {}
            image = ImageInput(
                offset=len(ids), length=length, digest=p.digest, width=p.width, height=p.height, pixels=p.pixels,
                **extra,
            )  # fmt: skip
            out.append(image)
            ids.extend([t] * length)
        return ids, out


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
