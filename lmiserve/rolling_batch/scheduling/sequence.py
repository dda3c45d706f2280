"""A sequence being generated: its tokens, how many of them are in the KV cache, and its blocks.

Plain Python, no torch: the scheduler and block manager are tested on their own.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from ...wire import SamplingParams

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Group:
    """The sequences of one request (``best_of`` of them)."""

    request_id: str
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)
    sequences: list[Sequence] = field(default_factory=list)
    beam: Any = None
    """The search state of a beam-search request (a ``generation.beam_scoring.BeamState`` over its sequences)."""
    adapter: Any = None
    """The LoRA adapter the request uses (a ``lora.adapters.Adapter``), or None."""
    deadline: float = 0.0
    """``time.monotonic()`` after which the request is not started (0: none)."""
    holds_slot: bool = False
    """Whether the request holds its adapter's device slot (while a sequence of it runs)."""
    images: tuple[Any, ...] = ()
    """The prompt's pictures (``wire.ImageInput``: a run of placeholder tokens and its pixels)."""
    rope: Any = None
    """Multimodal rotary positions: ``(positions (3, prompt length), shift of later tokens)``."""
    whole_images: bool = False
    """Its pictures' tokens attend to each other: a prompt chunk never ends inside a picture."""

    def image_bound(self, start: int, count: int) -> int:
        """``count`` prompt tokens from ``start``, moved so the chunk does not end inside a picture
        (with ``whole_images``): back to the picture's start, or on to its end when the chunk
        starts with it."""
        end = start + count
        for image in self.images if self.whole_images else ():
            first, last = image.offset, image.offset + image.length
            if first < end < last:
                return first - start if first > start else last - start
        return count

    @property
    def cache_key(self) -> int | None:
        """What the prefix cache's hash chain starts from: KV computed under one adapter is not
        another's (nor the base model's)."""
        return None if self.adapter is None else self.adapter.key

    @property
    def leader(self) -> Sequence:
        return self.sequences[0]


@dataclass(eq=False)
class Sequence:
    group: Group
    index: int
    token_ids: list[int]
    num_prompt_tokens: int
    seq_id: int = field(default_factory=lambda: next(_ids))
    num_computed: int = 0
    """Tokens whose keys and values are in the cache."""
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0
    """Leading full blocks already registered for prefix caching."""
    num_cached_prompt_tokens: int = 0
    """Prompt tokens found in the prefix cache at admission."""
    status: Status = Status.WAITING
    finish_reason: str | None = None
    cumulative_logprob: float = 0.0
    num_preemptions: int = 0
    ready_since: float = field(default_factory=time.monotonic)
    """When the sequence last became ready for a step: its arrival, then the end of each step
    that produced one of its tokens."""
    first_scheduled: float | None = None
    prompt_logprobs: list[float | None] = field(default_factory=lambda: [None])
    """Log-probability of each prompt token (the first has none), when the request asks."""
    prompt_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    """Log-probability of each generated token (kept for beam search, whose output comes at the end)."""
    draft: list[int] = field(default_factory=list)
    """Tokens proposed to follow the last one, checked in the next step (speculative decoding)."""
    spec: Any = None
    """Speculative decoding's record of how the sequence's proposals fare (``speculative.adaptive``)."""
    num_replayed: int = 0
    """Generated tokens the request brought with it (a replay, :mod:`..runner.replay`): they are output like
    any other generated token, but were never sampled here and are not emitted again."""

    @property
    def request_id(self) -> str:
        return self.group.request_id

    @property
    def params(self) -> SamplingParams:
        return self.group.params

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_emitted(self) -> int:
        """Generated tokens this engine sampled (the replayed ones aside)."""
        return self.num_generated - self.num_replayed

    @property
    def num_pending(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return len(self.token_ids) - self.num_computed

    @property
    def is_decoding(self) -> bool:
        return self.num_pending == 1 and self.num_computed >= self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id}#{self.index}, tokens={self.num_tokens}, computed={self.num_computed}, "
            f"blocks={len(self.block_table)}, {self.status.value})"
        )
