"""A step's image embeddings: which rows of the step are an image's placeholder tokens, and the
embeddings that take their place.

Each image is encoded once: its embeddings are kept by the picture's digest (an encoder cache
bounded in bytes), so a prompt chunked over several steps, a preempted sequence that recomputes
its prompt and a later request with the same picture all read them again. The pictures a step
needs and the cache does not hold are encoded in one batch (one at a time in deterministic
mode, so an image's embeddings never depend on what else the step holds)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from ...wire import ImageInput
from ..models.image_attention import ImageBlock
from ..models.vision.registry import VisionModel
from ..scheduling.scheduler import SchedulerOutput
from .step_inputs import StepArrays

CACHE_BYTES = 256 << 20
"""What the encoder cache may hold; the least recently used images leave first."""


class ImageRows:
    def __init__(
        self,
        vision: VisionModel,
        image_token_id: int,
        deterministic: bool,
        cache_bytes: int = CACHE_BYTES,
        bidirectional: bool = False,
    ):
        self.vision = vision
        self.bidirectional = bidirectional
        """A picture's tokens attend to each other both ways (Gemma 3): a prompt chunk never ends
        inside a picture, and the step's picture rows are attended again (:meth:`image_blocks`)."""
        self.image_token_id = image_token_id
        self.deterministic = deterministic
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._held = 0
        self.encoded = 0
        """Images run through the tower."""
        self.hits = 0
        """Images served from the encoder cache."""

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The placeholder tokens: the image token, and the video token of a model that takes video."""
        video = self.vision.video
        return (self.image_token_id,) if video is None else (self.image_token_id, video.video_token_id)

    def check(self, prompt_ids: list[int], images: list[ImageInput]) -> str:
        """Why these images cannot go with this prompt ("" when they can): each is one run of
        placeholder tokens inside the prompt, as long as the tower's output, in order."""
        end = 0
        for i, image in enumerate(images):
            what = "video" if image.frames else "image"
            if image.frames and self.vision.video is None:
                return f"{what} {i}: this model takes no video"
            token = self.token_ids[1] if image.frames else self.image_token_id
            span = prompt_ids[image.offset : image.offset + image.length]
            tokens = self.vision.tokens_for(image.width, image.height, image.frames)
            if image.offset < end or image.offset + image.length > len(prompt_ids):
                return f"{what} {i} is not a run of the prompt after the one before it"
            if image.length != tokens:
                size = (
                    f"{image.frames} frames of {image.width}x{image.height}"
                    if image.frames
                    else f"a {image.width}x{image.height} picture"
                )
                return f"{what} {i} takes {image.length} placeholder tokens; this model gives {tokens} for {size}"
            if any(t != token for t in span):
                return f"{what} {i}'s placeholder tokens are not the model's {what} token {token}"
            end = image.offset + image.length
        if sum(prompt_ids.count(t) for t in self.token_ids) != sum(image.length for image in images):
            return "the prompt holds image or video placeholder tokens that nothing fills"
        return ""

    @property
    def mrope(self) -> bool:
        """Whether the model's positions are multimodal (a picture's tokens laid out on its grid)."""
        return self.vision.token_grid(28, 28) is not None

    def rope(self, num_prompt: int, images: list[ImageInput]) -> tuple[np.ndarray, int] | None:
        """A prompt's multimodal rotary positions ``(3, num_prompt)`` (temporal, row, column) and
        the shift of the tokens after it: text counts on from the position before, a picture's
        tokens take its first free position as their time and add their row and column to it (a
        video's grid steps add their time, ``time_step`` apart, truncated), and the text after a
        picture or video starts past its larger side. None for a model without them."""
        if not images or not self.mrope:
            return None
        table = np.empty((3, num_prompt), dtype=np.int64)
        at = next_pos = 0
        for image in images:
            steps, rows, cols = self.vision.token_grid(image.width, image.height, image.frames)  # type: ignore[misc]
            text = image.offset - at
            table[:, at : image.offset] = np.arange(text) + next_pos
            next_pos += text
            end = image.offset + image.length
            times = (np.arange(steps) * self.vision.time_step(image)).astype(np.int64)
            table[0, image.offset : end] = np.repeat(times, rows * cols) + next_pos
            table[1, image.offset : end] = np.tile(np.repeat(np.arange(rows), cols), steps) + next_pos
            table[2, image.offset : end] = np.tile(np.arange(cols), rows * steps) + next_pos
            next_pos += max(rows, cols)
            at = end
        table[:, at:] = np.arange(num_prompt - at) + next_pos
        return table, int(table.max()) + 1 - num_prompt

    def inserts(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(rows, embeddings)`` for the step's placeholder tokens, or None when it has none.
        The step's rows are its decodes, then each prompt chunk's tokens in order."""
        row = len(out.decodes)
        runs: list[tuple[int, ImageInput, int, int]] = []
        for item in out.prefills:
            for image in item.seq.group.images:
                lo = max(image.offset, item.start)
                hi = min(image.offset + image.length, item.start + item.num_tokens)
                if lo < hi:
                    runs.append((row + lo - item.start, image, lo - image.offset, hi - image.offset))
            row += item.num_tokens
        if not runs:
            return None
        embeddings = self._embeddings([image for _, image, _, _ in runs])
        device = self.vision.device
        rows = torch.cat([torch.arange(r, r + hi - lo) for r, _, lo, hi in runs]).to(device)
        values = torch.cat([embeddings[image.digest][lo:hi] for _, image, lo, hi in runs])
        return rows, values

    def image_blocks(self, out: SchedulerOutput) -> list[ImageBlock] | None:
        """The pictures of the step's prompt chunks whose tokens attend to each other, or None."""
        if not self.bidirectional:
            return None
        row, blocks = len(out.decodes), []
        for item in out.prefills:
            end = item.start + item.num_tokens
            for image in item.seq.group.images:
                lo, hi = max(image.offset, item.start), min(image.offset + image.length, end)
                if lo >= hi:
                    continue
                if image.offset + image.length > end:
                    raise RuntimeError("a prompt chunk ends inside a picture whose tokens attend to each other")
                table = torch.tensor(item.seq.block_table, dtype=torch.int32, device=self.vision.device)
                blocks.append(
                    ImageBlock(
                        (row + lo - item.start, row + hi - item.start),
                        lo,
                        (image.offset, image.offset + image.length),
                        table,
                    )
                )
            row += item.num_tokens
        return blocks or None

    def _embeddings(self, images: list[ImageInput]) -> dict[str, torch.Tensor]:
        found: dict[str, torch.Tensor] = {}
        missing: dict[str, ImageInput] = {}
        for image in images:
            if image.digest in found or image.digest in missing:
                continue
            cached = self._cache.get(image.digest)
            if cached is None:
                missing[image.digest] = image
            else:
                self._cache.move_to_end(image.digest)
                found[image.digest] = cached
                self.hits += 1
        batches = [[m] for m in missing.values()] if self.deterministic else [list(missing.values())]
        for batch in batches:
            if batch:
                for image, emb in zip(batch, self.vision.encode(batch)):
                    found[image.digest] = emb
                    self._keep(image.digest, emb)
                self.encoded += len(batch)
        return found

    def _keep(self, digest: str, emb: torch.Tensor) -> None:
        size = emb.numel() * emb.element_size()
        if size > self.cache_bytes:
            return
        self._cache[digest] = emb
        self._held += size
        while self._held > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._held -= old.numel() * old.element_size()


def rope_positions(out: SchedulerOutput) -> np.ndarray | None:
    """The step's multimodal rotary positions ``(3, T)`` in its rows' order, or None when no
    sequence of it has a picture: a prompt token takes its prompt's, a later token its position
    plus the prompt's shift, and a sequence without pictures its position three times."""
    items = out.decodes + out.prefills
    if all(item.seq.group.rope is None for item in items):
        return None
    cols = []
    for item in items:
        p = np.arange(item.start, item.start + item.num_tokens, dtype=np.int64)
        rope = item.seq.group.rope
        if rope is None:
            cols.append(np.broadcast_to(p, (3, p.shape[0])))
            continue
        table, shift = rope
        c = np.empty((3, p.shape[0]), dtype=np.int64)
        inside = p < table.shape[1]
        c[:, inside] = table[:, p[inside]]
        c[:, ~inside] = p[~inside] + shift
        cols.append(c)
    return np.concatenate(cols, axis=1)


def shift_decodes(arrays: StepArrays, out: SchedulerOutput) -> None:
    """A decode-only step's positions as multimodal rotary positions: a generated token's three
    are equal, its position plus its prompt's shift, so the step keeps one position a token (and
    its captured graphs); the KV slots were worked out from the unshifted positions."""
    shifts = [0 if item.seq.group.rope is None else item.seq.group.rope[1] for item in out.decodes]
    if any(shifts):
        arrays.positions = arrays.positions + np.asarray(shifts, dtype=np.int64)
