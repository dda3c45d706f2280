"""Admitting a generation request: every check a request meets before it reaches the engine, in
one place, and the request the engine then runs, immutable.

A parser checks what its protocol defines. :meth:`Admission.admit` then bounds what any protocol
may ask (:mod:`.limits`), tokenizes, checks the prompt against the model (empty, token ids in the
vocabulary, ``max_input_token_len``, the context length) and settles ``max_new_tokens``
(MindIE's ``max_iter_times`` and its rule of lowering rather than refusing). It returns an
:class:`Admitted` request and leaves the parsed one as it was. A request it refuses raises
:class:`~lmiserve.errors.ValidationFailed`, which each protocol answers in its own shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgspec

from ..errors import ValidationFailed
from ..wire import ImageInput, SamplingParams
from . import limits
from .request import GenerationRequest
from .vision_prompt import VisionPrompt


@dataclass(frozen=True)
class Admitted:
    """A request as the engine runs it: its final prompt (text and ids) and sampling parameters."""

    request: GenerationRequest
    prompt_ids: tuple[int, ...]
    images: tuple[ImageInput, ...] = ()
    """The prompt's pictures and their placeholder runs in ``prompt_ids``."""

    @property
    def params(self) -> SamplingParams:
        return self.request.params


@dataclass(frozen=True)
class Admission:
    """What requests to one model are checked against (its settings and what loading it told)."""

    limits: limits.RequestLimits
    max_model_len: int
    max_input_token_len: int | None = None
    max_iter_times: int | None = None
    max_new_tokens_limit: int | None = None
    vocab_size: int | None = None
    vision: VisionPrompt | None = None
    """How the model's prompt holds pictures (None: it reads text only)."""

    @classmethod
    def for_model(
        cls, engine: Any, max_model_len: int, vocab_size: int | None = None, vision: VisionPrompt | None = None
    ) -> Admission:
        return cls(
            limits=limits.RequestLimits.from_settings(engine, max_model_len),
            max_model_len=max_model_len,
            max_input_token_len=engine.max_input_token_len,
            max_iter_times=engine.max_iter_times,
            max_new_tokens_limit=engine.max_new_tokens_limit,
            vocab_size=vocab_size,
            vision=vision,
        )

    def admit(self, request: GenerationRequest, tokenizer: Any) -> Admitted:
        limits.check(request, self.limits)
        if request.images and request.media_at is not None and self.vision is not None:
            request = _with_media_tokens(request, self.vision)
        ids, images = self._prompt_ids(request, tokenizer)
        params = self._params(request, len(ids))
        if params.bad_words:
            params = msgspec.structs.replace(params, bad_word_ids=bad_word_ids(params.bad_words, tokenizer))
        prompt = request.prompt or tokenizer.decode(ids)
        final = dataclasses.replace(request, prompt=prompt, prompt_ids=list(ids), params=params)
        return Admitted(final, tuple(ids), tuple(images))

    def _prompt_ids(self, request: GenerationRequest, tokenizer: Any) -> tuple[list[int], list[ImageInput]]:
        ids = request.prompt_ids
        images: list[ImageInput] = []
        if ids is None:
            text = request.prompt if self.vision is None else self.vision.widen(request.prompt)
            ids = tokenizer(text, add_special_tokens=request.add_special_tokens)["input_ids"]
            if self.vision is not None:  # each image token widened into its picture's placeholders
                ids, images = self.vision.expand(ids, request.images)
        elif self.vocab_size is not None and any(i >= self.vocab_size for i in ids):
            raise ValidationFailed(f"the prompt holds token ids outside the vocabulary (size {self.vocab_size})")
        if request.truncate is not None and len(ids) > request.truncate:
            ids = ids[-request.truncate :]
        if not ids:
            raise ValidationFailed("the prompt is empty")
        if self.max_input_token_len is not None and len(ids) > self.max_input_token_len:
            raise ValidationFailed(
                f"the prompt has {len(ids)} tokens, more than max_input_token_len ({self.max_input_token_len})"
            )
        if len(ids) >= self.max_model_len:
            raise ValidationFailed(
                f"the prompt has {len(ids)} tokens, more than max_model_len ({self.max_model_len}) allows"
            )
        return list(ids), images

    def _params(self, request: GenerationRequest, prompt_len: int) -> SamplingParams:
        wanted = request.params.max_new_tokens
        if request.max_new_tokens_omitted:  # MindIE: max_iter_times, 512 unless configured
            wanted = self.max_iter_times or limits.MINDIE_MAX_ITER_TIMES
        if self.max_iter_times is not None:
            wanted = min(wanted, self.max_iter_times)
        if request.cap_max_new_tokens or request.max_new_tokens_omitted:
            # MindIE: outputLen = min(maxSeqLen - inputLen, maxOutputLen); it ends with "length"
            room = min(self.max_model_len - prompt_len, self.max_new_tokens_limit or self.max_model_len)
            wanted = min(wanted, room)
        if request.fit_context and prompt_len + wanted > self.max_model_len:
            raise ValidationFailed(
                f"the prompt ({prompt_len} tokens) and max_tokens ({wanted}) exceed the "
                f"context length of {self.max_model_len} tokens"
            )
        params = request.params
        if wanted != params.max_new_tokens:
            params = msgspec.structs.replace(params, max_new_tokens=wanted)
        return params


def bad_word_ids(words: list[str], tokenizer: Any) -> list[list[int]]:
    """Each bad word's tokens, and those of the word after a space where that starts with another
    token but is as long (how vLLM reads ``bad_words``)."""
    out: list[list[int]] = []
    for word in words:
        bare = tokenizer(word.lstrip(), add_special_tokens=False)["input_ids"]
        spaced = tokenizer(" " + word.lstrip(), add_special_tokens=False)["input_ids"]
        out += [list(bare)] if bare else []
        if spaced and (not bare or (spaced[0] != bare[0] and len(spaced) == len(bare))):
            out.append(list(spaced))
    return out


def _with_media_tokens(request: GenerationRequest, vision: VisionPrompt) -> GenerationRequest:
    """The prompt with the model's image (video) placeholder at each picture's (video's) place."""
    prompt, last = [], 0
    for ref, at in zip(request.media or [], request.media_at or []):
        if ref.kind == "video":
            token = vision.video_placeholder or vision.video_token
        else:
            token = vision.placeholder or vision.image_token
        prompt += [request.prompt[last:at], token]
        last = at
    return dataclasses.replace(request, prompt="".join([*prompt, request.prompt[last:]]), media_at=None)
