"""Media parts in a request's JSON: OpenAI chat content parts (``image_url``, ``video_url``,
``input_audio``/``audio_url``), MindIE's multimodal ``inputs`` list, and TGI's markdown images
(``![](url)``) in ``inputs``. Each becomes a :class:`~lmiserve.media.MediaRef` naming where it
came from; fetching and decoding happen later, outside the parsers."""

from __future__ import annotations

import re
from typing import Any

from ..errors import ValidationFailed
from ..media import MediaRef

PART_KINDS = {"image_url": "image", "video_url": "video", "audio_url": "audio", "input_audio": "audio"}
"""A content part's type and the kind of media it carries."""
TEMPLATE_PARTS = {"image": {"type": "image"}, "video": {"type": "video"}, "audio": {"type": "audio"}}
"""What a chat template reads in place of each kind (Hugging Face's multimodal message format)."""
MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def part_source(part: dict[str, Any], where: str) -> str:
    """The URL, data URL, base64 text or path a media part names: ``{"image_url": {"url": ...}}``
    (OpenAI) or ``{"image_url": "..."}`` (MindIE); ``input_audio`` carries ``{"data", "format"}``."""
    kind = part.get("type")
    value = part.get(kind) if isinstance(kind, str) else None
    if kind == "input_audio" and isinstance(value, dict) and isinstance(value.get("data"), str):
        return f"data:audio/{value.get('format') or 'wav'};base64,{value['data']}"
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value.strip():
        raise ValidationFailed(f"{where}: this {kind} part needs a non-empty {kind!r} (a URL, a data URL or a path)")
    return value.strip()


def chat_refs(messages: list[Any]) -> list[MediaRef]:
    """The media parts of OpenAI chat messages (objects with ``content``), in order."""
    refs = []
    for i, message in enumerate(messages):
        content = message.content if not isinstance(message, dict) else message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            data = part if isinstance(part, dict) else part.model_dump()
            kind = PART_KINDS.get(data.get("type"))
            if kind is not None:
                where = f"messages[{i}].content[{j}]"
                refs.append(MediaRef(kind, part_source(data, where), where))
    return refs


def template_content(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A message's parts as a chat template reads them: text parts, and ``{"type": "image"}`` (or
    video, audio) where a media part was."""
    out = []
    for part in parts:
        kind = PART_KINDS.get(part.get("type"))
        out.append(dict(TEMPLATE_PARTS[kind]) if kind else {"type": "text", "text": part.get("text") or ""})
    return out


def inputs_parts(parts: list[Any]) -> tuple[str, list[MediaRef], list[int]]:
    """MindIE's multimodal ``inputs``: ``(prompt, media, where in the prompt each goes)``. The parts
    are joined with newlines (as vLLM joins a message's text parts), each media part on a line of
    its own."""
    prompt = ""
    refs: list[MediaRef] = []
    offsets: list[int] = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"inputs[{i}]"
        if i:
            prompt += "\n"
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str) or not text:
                raise ValidationFailed(f"{where}: a text part needs a non-empty 'text'")
            prompt += text
        elif kind in ("image_url", "video_url", "audio_url"):
            refs.append(MediaRef(PART_KINDS[kind], part_source(part, where), where))
            offsets.append(len(prompt))
        else:
            raise ValidationFailed(f"{where}: type must be one of text, image_url, video_url, audio_url (got {kind!r})")
    if len(refs) == len(parts):
        raise ValidationFailed("inputs: the list holds no text part")
    return prompt, refs, offsets


def markdown_images(prompt: str) -> tuple[str, list[MediaRef], list[int]]:
    """TGI's images in ``inputs``: each ``![alt](url)`` taken out of the text, with its place."""
    out: list[str] = []
    refs: list[MediaRef] = []
    offsets: list[int] = []
    last = length = 0
    for n, m in enumerate(MARKDOWN_IMAGE.finditer(prompt)):
        out.append(prompt[last : m.start()])
        length += m.start() - last
        refs.append(MediaRef("image", m.group(1), f"inputs (image {n})"))
        offsets.append(length)
        last = m.end()
    out.append(prompt[last:])
    return "".join(out), refs, offsets
