"""Protocol-independent generation requests and their outputs.

Parsers turn a protocol's body into a :class:`GenerationRequest`; the output processor turns
the engine's token ids into :class:`RequestOutput` updates; formatters turn those into bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..wire import SamplingParams


@dataclass
class GenerationRequest:
    prompt: str
    params: SamplingParams
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool | None = None
    """Join the text around kept special tokens with a space (True) or nothing (False);
    None: as the tokenizer decodes."""
    truncate: int | None = None
    """Keep only the last ``truncate`` prompt tokens."""
    prompt_ids: list[int] | None = None
    """Set when the client sent token ids, or after tokenization."""
    token_strings: bool = False
    """Record each token's own text (OpenAI logprobs list tokens as strings)."""
    add_special_tokens: bool = True
    """Let the tokenizer add its special tokens (False for chat prompts, whose template has them)."""
    cap_max_new_tokens: bool = False
    """Lower ``max_new_tokens`` to what the server allows (max_iter_times, max_new_tokens_limit,
    the room left in the context) instead of refusing it (MindIE's rule)."""
    max_new_tokens_omitted: bool = False
    """The client sent no ``max_new_tokens`` (MindIE: then max_iter_times, 512 unless configured)."""
    fit_context: bool = False
    """Refuse the request when the prompt leaves no room for ``max_new_tokens`` in the context
    (otherwise generation just ends when the context is full)."""
    adapter: str | None = None
    """The LoRA adapter to generate with (a registered name); None or "": the base model."""
    media: list[Any] = field(default_factory=list)
    """The pictures (and other media) the request names (``media.MediaRef``), in prompt order."""
    media_at: list[int] | None = None
    """Where in ``prompt`` each of ``media`` goes (character offsets), for a prompt no chat template
    rendered; None: the prompt holds the model's image token where each goes (a template wrote it)."""
    markdown_images: bool = False
    """TGI: ``![](url)`` in the prompt is a picture where the model takes images (text otherwise)."""
    images: list[Any] = field(default_factory=list)
    """``media`` fetched, decoded and checked (``media.DecodedImage``), before admission."""
    chat: bool = False
    """The answer goes to a chat formatter, which tells a reasoning model's thinking apart itself."""
    drop_thinking: str | None = None
    """The reasoning parser whose thinking is left out of the text (``option.strip_reasoning``)."""


@dataclass
class TokenOutput:
    id: int
    text: str
    """What this token added to the sequence's text (empty while a character is incomplete
    or while a possible stop string is held back)."""
    logprob: float | None
    special: bool = False
    top: list[TokenOutput] | None = None
    token: str | None = None
    """The token's own text, when the request asked for token strings."""


@dataclass
class SequenceOutput:
    index: int
    text: str = ""
    tokens: list[TokenOutput] = field(default_factory=list)
    new_tokens: list[TokenOutput] = field(default_factory=list)
    """Tokens added by the latest update (what a streaming formatter sends)."""
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    """The stop string or stop token id that ended the sequence, if one did."""
    cumulative_logprob: float = 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    sequences: list[SequenceOutput]
    prompt_tokens: list[TokenOutput] | None = None
    """Each prompt token with its log-probability, when the request asked for them."""
    num_cached_tokens: int = 0
    error: str | None = None
    error_kind: str = ""
    seed: int | None = None
    arrival: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    last_index: int = 0
    """The sequence the latest update was about (its ``new_tokens`` are that update's)."""
    batch_sizes: list[int] = field(default_factory=list)
    """Per generated position, the size of the engine step that produced it."""
    queue_us: list[int] = field(default_factory=list)
    """Per generated position, microseconds waited for that step."""
    step_stats: bool = True
    """The engine reported each step's batch size and wait (vLLM does not: both lists stay empty)."""
    adapter: str = ""
    """The LoRA adapter the request used ("" for the base model)."""

    @property
    def finished(self) -> bool:
        return self.error is not None or all(s.finished for s in self.sequences)

    @property
    def generated_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.sequences)

    def ranked(self) -> list[SequenceOutput]:
        """Sequences best first (highest cumulative log-probability)."""
        return sorted(self.sequences, key=lambda s: s.cumulative_logprob, reverse=True)
