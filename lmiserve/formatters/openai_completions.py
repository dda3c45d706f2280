"""OpenAI ``/v1/completions`` (with MindIE's and vLLM's extra fields).

``prompt`` is a string, a list of strings, a list of token ids or a list of those; each
prompt gets ``n`` choices (the best ``n`` of ``best_of``). Streaming sends SSE chunks and then
``data: [DONE]``. ``usage`` counts every choice and carries MindIE's per-token ``batch_size``
and ``queue_wait_time`` lists.

MindIE's document decides where it and OpenAI differ: ``max_tokens`` left out means MindIE's
maxIterTimes (``option.max_iter_times``, else 512), and any ``max_tokens`` is lowered to
``min(max_iter_times, max_tokens)`` and to what fits in the context instead of refused;
``temperature`` is any value >= 0; ``stop`` may hold 32768 characters in all;
``stop_token_ids`` outside int32 are ignored; a stream with ``use_beam_search`` or ``n`` > 1
is "fake streaming", one event holding every choice.

vLLM's ``structured_outputs`` and ``guided_*`` fields constrain the output
(:mod:`.structured_outputs`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import Field, field_validator, model_validator

from ..errors import ValidationFailed
from ..generation.request import GenerationRequest, RequestOutput, SequenceOutput, TokenOutput
from . import json_wire
from .openai_common import OPENAI_COMPLETIONS, SamplingFields, Style, StyledResponder, chosen, finish_reason, usage
from .structured_outputs import StructuredOutputFields
from .validation import validated

Prompt = str | list[str] | list[int] | list[list[int]]


MAX_I32 = 2**31 - 1
MAX_STOP_CHARACTERS = 32768
DEFAULT_MAX_TOKENS = 16
"""A placeholder while the prompt's length is unknown: a request without ``max_tokens`` gets
max_iter_times (MindIE's default) when it is tokenized."""


class CompletionRequest(SamplingFields, StructuredOutputFields):
    prompt: Prompt
    max_tokens: int | None = Field(None, ge=1, le=MAX_I32)
    temperature: float = Field(1.0, ge=0)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _int32_stop_token_ids(cls, data: Any) -> Any:
        ids = data.get("stop_token_ids") if isinstance(data, dict) else None
        if isinstance(ids, list):  # MindIE: ids outside int32 are ignored
            kept = [i for i in ids if not (isinstance(i, int) and not isinstance(i, bool)) or 0 <= i <= MAX_I32]
            data = {**data, "stop_token_ids": kept}
        return data

    @field_validator("stop")
    @classmethod
    def _stop_length(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not s for s in v):
            raise ValueError("a stop string must not be empty")
        if sum(len(s) for s in v) > MAX_STOP_CHARACTERS:
            raise ValueError(f"stop strings may have {MAX_STOP_CHARACTERS} characters in all")
        return v

    @property
    def fake_streaming(self) -> bool:
        """MindIE streams beam search and n > 1 as one event holding every choice."""
        return self.stream and (self.use_beam_search or self.n > 1)

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: Prompt) -> Prompt:
        if isinstance(v, str):
            if not v:
                raise ValueError("prompt must not be empty")
        elif not v:
            raise ValueError("prompt must hold at least one prompt")
        elif isinstance(v[0], list) and any(not p for p in v):  # type: ignore[union-attr]
            raise ValueError("a token-id prompt must not be empty")
        return v

    def prompts(self) -> list[tuple[str, list[int] | None]]:
        p = self.prompt
        if isinstance(p, str):
            return [(p, None)]
        if all(isinstance(x, str) for x in p):
            return [(x, None) for x in p]  # type: ignore[misc]
        if all(isinstance(x, int) for x in p):
            return [("", list(p))]  # type: ignore[arg-type]
        return [("", list(x)) for x in p]  # type: ignore[union-attr]


def parse(data: dict[str, Any], mindie: bool = False) -> CompletionRequest:
    """``mindie``: ``POST /v1/completions``, with MindIE's document's rules on top of the request's
    own: ``model`` is required, ``seed`` lies in (0, 2**64 - 1] and ``top_k`` is -1 or positive."""
    if "prompt" not in data:
        raise ValidationFailed("'prompt' is required")
    if mindie:
        _mindie_ranges(data)
    req = validated(CompletionRequest, data)
    if mindie and (req.best_of or req.n) > 1 and req.temperature == 0 and not req.use_beam_search:
        raise ValidationFailed("n or best_of above 1 needs temperature above 0")
    return req


def _mindie_ranges(data: dict[str, Any]) -> None:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise ValidationFailed("'model' is required: the served model's name")
    seed, top_k = data.get("seed"), data.get("top_k")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed == 0:
        raise ValidationFailed("seed must be in (0, 18446744073709551615]")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k == 0:
        raise ValidationFailed("top_k must be -1 or in (0, 2147483647]")


def generation_requests(req: CompletionRequest) -> list[GenerationRequest]:
    k = req.logprobs
    params = req.sampling(
        req.max_tokens or DEFAULT_MAX_TOKENS,
        logprobs=k or 0,
        prompt_logprobs=(k or 0) if (req.echo and k is not None) else None,
    )
    guided = req.structured_guided()
    if guided is not None:
        params = msgspec.structs.replace(params, guided=guided)
    return [
        GenerationRequest(
            prompt=text,
            prompt_ids=ids,
            params=params,
            stop=list(req.stop),
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            token_strings=k is not None,
            cap_max_new_tokens=True,
            max_new_tokens_omitted=req.max_tokens is None,
        )
        for text, ids in req.prompts()
    ]


def _top(t: TokenOutput) -> dict[str, float]:
    entries = {a.token or a.text: a.logprob for a in t.top or [] if a.logprob is not None}
    entries.setdefault(t.token or t.text, t.logprob)  # type: ignore[arg-type]
    return entries


def logprobs(tokens: list[TokenOutput], start: int = 0) -> dict[str, Any]:
    """The legacy completions logprobs object for ``tokens``, offsets counted from ``start``."""
    offsets, offset = [], start
    for t in tokens:
        offsets.append(offset)
        offset += len(t.text)
    return {
        "text_offset": offsets,
        "token_logprobs": [t.logprob for t in tokens],
        "tokens": [t.token if t.token is not None else t.text for t in tokens],
        "top_logprobs": [_top(t) if t.logprob is not None else None for t in tokens],
    }


class CompletionResponder(StyledResponder):
    req: CompletionRequest

    def __init__(self, req: CompletionRequest, model: str, style: Style = OPENAI_COMPLETIONS):
        super().__init__(req, model, style, "cmpl")
        self.echo_prompts: list[str] | None = None
        self._offsets: dict[tuple[int, int], int] = {}
        self._echoed: set[tuple[int, int]] = set()

    def _choice_index(self, prompt_index: int, seq_index: int) -> int:
        return prompt_index if self.style.index_is_prompt else prompt_index * self.req.n + seq_index

    def _echoed_prompt(self, prompt_index: int, out: RequestOutput) -> str:
        """The prompt as the client sent it (not as a chat template rendered it)."""
        return self.echo_prompts[prompt_index] if self.echo_prompts else out.prompt

    def _text(self, prompt_index: int, out: RequestOutput, seq: SequenceOutput) -> str:
        text = (self._echoed_prompt(prompt_index, out) if self.req.echo else "") + seq.text
        if self.req.suffix and seq.finished:
            text += self.req.suffix
        return text

    def _choice(
        self, prompt_index: int, out: RequestOutput, seq: SequenceOutput, rank: int, start: int = 0
    ) -> dict[str, Any]:
        lp = None
        if self.req.logprobs is not None:
            tokens = list(seq.tokens)
            if self.req.echo and out.prompt_tokens is not None:
                tokens = list(out.prompt_tokens) + tokens
            lp = logprobs(tokens, start)
        return {
            "index": self._choice_index(prompt_index, rank),
            "text": self._text(prompt_index, out, seq),
            "logprobs": lp,
            "finish_reason": finish_reason(seq),
            "stop_reason": seq.stop_reason,
        }

    def _whole(self, outs: list[RequestOutput]) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        start = 0
        for i, out in enumerate(outs):
            for rank, seq in enumerate(chosen(out, self.req.n)):
                choices.append(self._choice(i, out, seq, rank, start))
                if self.style.offsets_across_choices:
                    start += len(choices[-1]["text"])
        return self.envelope(choices, usage=usage(outs, mindie=self.mindie_usage))

    def body(self, outs: list[RequestOutput]) -> bytes:
        return json_wire.dumps(self._whole(outs))

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        if self.req.fake_streaming:
            return b""  # every choice goes out at the end, in one event
        seq = out.sequences[out.last_index]
        if not seq.new_tokens and not seq.finished:
            return b""
        key = (index, seq.index)
        text = "".join(t.text for t in seq.new_tokens)
        tokens = list(seq.new_tokens)
        start = self._offsets.get(key, 0)
        if self.req.echo and key not in self._echoed:
            self._echoed.add(key)
            text = self._echoed_prompt(index, out) + text
            if out.prompt_tokens is not None:
                tokens = list(out.prompt_tokens) + tokens
        lp = logprobs(tokens, start) if self.req.logprobs is not None else None
        self._offsets[key] = start + len(text)
        if seq.finished and self.req.suffix:
            text += self.req.suffix
        choice = {
            "index": self._choice_index(index, seq.index),
            "text": text,
            "logprobs": lp,
            "finish_reason": finish_reason(seq),
            "stop_reason": seq.stop_reason,
        }
        chunk = self.envelope([choice])
        closing = self.closing_usage(self.req.include_usage) if seq.finished else None
        if closing is not None:
            chunk["usage"] = closing
        return self.frame(chunk)

    def end(self, outs: list[RequestOutput]) -> bytes:
        tail = b""
        if self.req.fake_streaming:
            return self.frame(self._whole(outs)) + self.style.framing.done
        if self.req.include_usage:
            tail += self.frame(self.envelope([], usage=usage(outs, mindie=self.mindie_usage)))
        return tail + self.style.framing.done
