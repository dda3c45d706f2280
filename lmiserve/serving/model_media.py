"""What a served model does with the pictures and videos a request sends: its vision rules (or
none), the media policy of ``serving.properties`` (sizes, counts, domains, local paths), and the
media fetched and decoded in the API process before the request is admitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..formatters.media_parts import markdown_images
from ..generation.request import GenerationRequest
from ..generation.vision_prompt import VisionPrompt
from ..media import MediaError, MediaPolicy, MediaRef, resolve_media

NO_AUDIO = "an audio part: no model served here takes audio yet"


class ModelMedia:
    def __init__(self, name: str, settings: Any, backend: str = "lmi"):
        self.name = name
        self.settings = settings
        self.backend = backend
        self.policy = MediaPolicy()
        self.vision: VisionPrompt | None = None
        """How the model's prompt holds pictures, once loaded (None: text only)."""

    def load(self, model_dir: Path, tokenizer: Any) -> None:
        """The model's vision rules and the media settings (a malformed one fails the load)."""
        try:
            self.policy = MediaPolicy.from_options(self.settings.handler_properties())
        except ValueError as exc:
            raise ValueError(f"option.{exc}") from None
        self.vision = VisionPrompt.of(model_dir, tokenizer)

    def refuse(self, ref: MediaRef) -> None:
        """A part this model cannot take, refused as the part's own 400."""
        if ref.kind == "audio":
            raise MediaError(ref.where, NO_AUDIO, reason="unsupported")
        if self.vision is None and self.backend == "vllm":
            why = f"model {self.name} runs on option.rolling_batch=vllm, which is not given pictures or videos yet"
            raise MediaError(ref.where, why, reason="no_vision")
        if self.vision is None:
            raise MediaError(
                ref.where, f"model {self.name} reads text only; it cannot take {ref.kind}s", reason="no_vision"
            )
        if ref.kind == "video" and not self.vision.takes_video:
            why = f"model {self.name} takes images, not video (Qwen2-VL and Qwen2.5-VL take video)"
            raise MediaError(ref.where, why, reason="unsupported")

    def check_messages(self, messages: list[dict[str, Any]]) -> None:
        """Before a chat template renders them: a media part this model cannot take is refused."""
        for i, message in enumerate(messages):
            content = message.get("content")
            for j, part in enumerate(content if isinstance(content, list) else []):
                kind = part.get("type")
                if kind in ("image", "video", "audio"):
                    self.refuse(MediaRef(kind, "", f"messages[{i}].content[{j}]"))

    async def prepare(self, requests: list[GenerationRequest]) -> None:
        """Each request's pictures and videos fetched, decoded and checked (``request.images``)."""
        for request in requests:
            if request.markdown_images and self.vision is not None and not request.media:
                prompt, refs, offsets = markdown_images(request.prompt)
                if refs:
                    request.prompt, request.media, request.media_at = prompt, refs, offsets
            if not request.media:
                continue
            for ref in request.media:
                self.refuse(ref)
            video = None
            if self.vision is not None and self.vision.takes_video:
                video = (self.vision.sampling, self.vision.frame_size)
            request.images = await resolve_media(request.media, self.policy, video=video)

    def describe(self) -> dict[str, Any]:
        """What ``GET /models`` says of the model's inputs."""
        if self.vision is None:
            return {"modalities": ["text"]}
        kinds = ["image", "video"] if self.vision.takes_video else ["image"]
        limits = {kind: self.policy.limit_per_prompt.get(kind, self.policy.max_parts) for kind in kinds}
        return {"modalities": ["text", *kinds], "limit_mm_per_prompt": limits}
