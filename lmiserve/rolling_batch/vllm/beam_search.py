"""Beam search on the vllm backend, above vLLM's engine as vLLM's own server runs it.

vLLM's engine samples; its server searches beams by asking the engine for one token of every
running beam with that token's top log-probabilities, step after step. This does the same with
the scoring rules of lmiserve's own engine (:mod:`lmiserve.generation.beam_scoring`,
transformers' rules): each step, each running beam's top ``max(2, 1 + #eos) * width``
log-probabilities (enough for the step's best candidates over all beams) come from one
one-token vLLM request; vLLM's prefix cache keeps each beam's prompt from being computed again.
The answer comes once the search ends: the best ``n`` hypotheses, best first, as the engine
sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ... import wire
from ...generation.beam_scoring import NEG, BeamState
from ...generation.eos_tokens import eos_token_ids as with_generation_config
from .params import one_token_params

OneToken = Callable[[list[int], str, int], Awaitable[dict[int, float]]]
"""``(tokens, vllm request id, k)`` -> the top ``k`` log-probabilities of the next token."""


@dataclass
class Beam:
    """A running beam, as :class:`BeamState` reads one."""

    token_ids: list[int]
    num_prompt_tokens: int
    token_logprobs: list[float] = field(default_factory=list)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def candidates_per_beam(width: int, eos: frozenset[int]) -> int:
    return max(2, 1 + len(eos)) * width


def eos_token_ids(model_path: Path) -> tuple[int, ...]:
    """The model's end-of-sequence ids: its config's (or its language model's), then
    generation_config.json's."""
    ids: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        config = json.loads((model_path / "config.json").read_text())
        eos = config.get("eos_token_id", (config.get("text_config") or {}).get("eos_token_id"))
        ids = [eos] if isinstance(eos, int) else [t for t in eos or [] if isinstance(t, int)]
    with contextlib.suppress(OSError, ValueError):
        return with_generation_config(model_path, tuple(ids))
    return tuple(ids)


async def search(
    one_token: OneToken,
    request_id: str,
    prompt_ids: list[int],
    params: wire.SamplingParams,
    eos_ids: tuple[int, ...],
    max_model_len: int,
) -> list[wire.SeqDelta]:
    """Run the search; the deltas of its hypotheses (``index`` = rank)."""
    eos = frozenset() if params.ignore_eos else frozenset(eos_ids)
    width = params.num_beams
    k = candidates_per_beam(width, eos)
    start = Beam(list(prompt_ids), len(prompt_ids))
    state = BeamState(width, params.n, params.length_penalty, params.early_stopping, [start], [0.0])  # type: ignore[list-item]
    step = 0
    while not state.done:
        beams: list[Beam] = state.running  # type: ignore[assignment]
        rows = await asyncio.gather(
            *(one_token(b.token_ids, f"{request_id}#beam{step}.{i}", k) for i, b in enumerate(beams))
        )
        at_limit = [b.num_generated + 1 >= params.max_new_tokens or b.num_tokens + 1 >= max_model_len for b in beams]
        survivors = state.step(_dense(rows), eos, at_limit)
        children = [
            Beam(
                [*beams[c.parent].token_ids, c.token],
                start.num_prompt_tokens,
                [*beams[c.parent].token_logprobs, c.logprob],
            )
            for c in survivors
        ]
        state.running, state.scores = children, [c.cumulative for c in survivors]  # type: ignore[assignment]
        step += 1
    return [
        wire.SeqDelta(
            request_id=request_id,
            index=rank,
            token_ids=hyp.tokens,
            logprobs=hyp.logprobs,
            cumulative_logprob=hyp.score,
            finish_reason=hyp.finish_reason,
            num_prompt_tokens=len(prompt_ids) if rank == 0 else 0,
        )
        for rank, hyp in enumerate(state.results())
    ]


async def one_token(engine: Any, api: Any, tokens: list[int], vllm_id: str, k: int) -> dict[int, float]:
    """The next token's top ``k`` log-probabilities after ``tokens``, from one vLLM request."""
    last = None
    outputs = engine.generate({"prompt_token_ids": tokens}, one_token_params(api, k), vllm_id)
    async with contextlib.aclosing(outputs):
        async for output in outputs:
            last = output
    completion = last.outputs[0] if last is not None and last.outputs else None
    if completion is None or completion.finish_reason == "error" or not completion.logprobs:
        raise RuntimeError(f"vLLM gave no log-probabilities for beam request {vllm_id}")
    entries = completion.logprobs[-1] or {}
    return {int(t): float(getattr(lp, "logprob", lp)) for t, lp in entries.items()}


def _dense(rows: list[dict[int, float]]) -> torch.Tensor:
    """The beams' log-probability rows, every token vLLM did not name at :data:`NEG`."""
    vocab = 1 + max((t for row in rows for t in row), default=0)
    dense = torch.full((len(rows), vocab), NEG, dtype=torch.float32)
    for i, row in enumerate(rows):
        if row:
            dense[i, list(row)] = torch.tensor(list(row.values()), dtype=torch.float32)
    return dense
