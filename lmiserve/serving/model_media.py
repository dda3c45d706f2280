"""What a served model does with the pictures a request sends: its vision rules (or none), the
media policy of ``serving.properties`` (sizes, counts, domains, local paths), and the pictures
fetched and decoded in the API process before the request is admitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..formatters.media_parts import markdown_images
from ..generation.request import GenerationRequest
from ..generation.vision_prompt import VisionPrompt
from ..media import MediaError, MediaPolicy, MediaRef, resolve_images

NOT_SERVED = {
    "video": "no model served here takes video yet",
    "audio": "no model served here takes audio yet",
}


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
        if ref.kind in NOT_SERVED:
            raise MediaError(
                ref.where,
                f"an {ref.kind} part: {NOT_SERVED[ref.kind]}"
                if ref.kind == "audio"
                else f"a {ref.kind} part: {NOT_SERVED[ref.kind]}",
                reason="unsupported",
            )
        if self.vision is None and self.backend == "vllm":
            why = f"model {self.name} runs on option.rolling_batch=vllm, which is not given pictures yet"
            raise MediaError(ref.where, why, reason="no_vision")
        if self.vision is None:
            raise MediaError(ref.where, f"model {self.name} reads text only; it cannot take images", reason="no_vision")

    def check_messages(self, messages: list[dict[str, Any]]) -> None:
        """Before a chat template renders them: a media part this model cannot take is refused."""
        for i, message in enumerate(messages):
            content = message.get("content")
            for j, part in enumerate(content if isinstance(content, list) else []):
                kind = part.get("type")
                if kind in ("image", "video", "audio"):
                    self.refuse(MediaRef(kind, "", f"messages[{i}].content[{j}]"))

    async def prepare(self, requests: list[GenerationRequest]) -> None:
        """Each request's pictures fetched, decoded and checked (``request.images``)."""
        for request in requests:
            if request.markdown_images and self.vision is not None and not request.media:
                prompt, refs, offsets = markdown_images(request.prompt)
                if refs:
                    request.prompt, request.media, request.media_at = prompt, refs, offsets
            if not request.media:
                continue
            for ref in request.media:
                self.refuse(ref)
            request.images = await resolve_images(request.media, self.policy)

    def describe(self) -> dict[str, Any]:
        """What ``GET /models`` says of the model's inputs."""
        if self.vision is None:
            return {"modalities": ["text"]}
        limits = {"image": self.policy.limit_per_prompt.get("image", self.policy.max_parts)}
        return {"modalities": ["text", "image"], "limit_mm_per_prompt": limits}
