"""Many prompts, each with its own sampling parameters, in one padded transformers ``generate`` call.

``generate`` samples with one set of parameters for the whole batch, so it runs greedy and
rows are sampled by :class:`_RowSampler`, a logits processor that draws each sampled row's
token with that row's temperature/typical-p/top-k/top-p/min-p and its own seeded generator, and masks the
rest of the row's logits. Greedy rows pass through untouched, so their tokens are exactly
what ``generate`` would pick. :class:`_RowTracker`, a stopping criterion, follows every row:
detokenizes incrementally, applies stop sequences and per-row token limits, and reports
each step's text to a callback for streaming.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from ..formatters.lmi_dynamic import DynamicParameters
from ..generation.detokenizer import IncrementalDetokenizer
from ..generation.sampling import (
    apply_penalties,
    apply_temperature,
    apply_top_k_top_p_min_p,
    apply_typical_p,
    make_generator,
    sample_rows,
)
from ..generation.stop_strings import StopStringMatcher


@dataclass
class StepToken:
    """What one step did to a row: its token (the end-of-sequence token too), the token's
    log-probability (None unless the row asked for details), the text it added, and why the
    row ended there (None while it goes on)."""

    id: int
    logprob: float | None
    text: str
    finish_reason: str | None = None
    top: list[tuple[int, float]] | None = None
    """The row's ``top_n_tokens`` most likely tokens and their log-probabilities, where asked."""


StepCallback = Callable[[list[StepToken | None]], None]
"""Per step, each row's :class:`StepToken` (None for a row that ended before it)."""


@dataclass
class GenRow:
    """One prompt, decoded as its request's parameters say (``max_new_tokens``, sampling,
    ``seed``, ``stop_sequences``)."""

    prompt_ids: list[int]
    params: DynamicParameters = field(default_factory=DynamicParameters)


@dataclass
class RowResult:
    text: str
    finish_reason: str
    tokens: list[StepToken] = field(default_factory=list)
    """Every token generated, the end-of-sequence token included."""

    @property
    def token_ids(self) -> list[int]:
        """The tokens of the text (the end-of-sequence token left out)."""
        ids = [t.id for t in self.tokens]
        return ids[:-1] if self.finish_reason == "eos_token" else ids


class _RowState:
    def __init__(self, row: GenRow, tokenizer: Any):
        self.row = row
        self.detok = IncrementalDetokenizer(tokenizer, row.prompt_ids)
        self.matcher = StopStringMatcher(row.params.stop_sequences)
        self.ids: list[int] = []
        self.tokens: list[StepToken] = []
        self.text = ""
        self.finish_reason: str | None = None

    def _finish(self, reason: str) -> str:
        self.finish_reason = reason
        if reason == "stop_sequence":
            return ""
        tail = self.matcher.feed(self.detok.flush())
        return tail + self.matcher.flush()

    def step(
        self,
        token: int,
        eos_ids: frozenset[int],
        logprob: float | None = None,
        top: list[tuple[int, float]] | None = None,
    ) -> StepToken:
        text = self._advance(token, eos_ids)
        self.tokens.append(StepToken(token, logprob, text, self.finish_reason, top))
        return self.tokens[-1]

    def _advance(self, token: int, eos_ids: frozenset[int]) -> str:
        p = self.row.params
        if token in eos_ids and not p.ignore_eos_token:
            out = self._finish("eos_token")
        elif token in p.stop_token_ids:  # kept, as the engine keeps a stop token
            self.ids.append(token)
            out = self.matcher.feed(self.detok.add([token])) + self._finish("stop_sequence")
        else:
            self.ids.append(token)
            out = self.matcher.feed(self.detok.add([token]))
            if self.matcher.matched is not None:
                self._finish("stop_sequence")
            elif len(self.ids) >= self.row.params.max_new_tokens:
                out += self._finish("length")
        self.text += out
        return out


class _RowTracker(StoppingCriteria):
    def __init__(
        self, states: list[_RowState], eos_ids: frozenset[int], on_step: StepCallback | None, sampler: _RowSampler
    ):
        self.states = states
        self.eos_ids = eos_ids
        self.on_step = on_step
        self.sampler = sampler

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        last = input_ids[:, -1].tolist()
        logprobs, tops = self.sampler.chosen_logprobs(last), self.sampler.top_tokens()
        deltas: list[StepToken | None] = []
        for state, token, lp, top in zip(self.states, last, logprobs, tops):
            deltas.append(None if state.finish_reason is not None else state.step(token, self.eos_ids, lp, top))
        if self.on_step is not None:
            self.on_step(deltas)
        done = [state.finish_reason is not None for state in self.states]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]


class _RowSampler(LogitsProcessor):
    def __init__(self, rows: list[GenRow], pad_lengths: list[int], device: torch.device, eos_ids: frozenset[int]):
        self.eos_ids = sorted(eos_ids)
        self.penalized = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
        self.additive = [i for i, r in enumerate(rows) if r.params.presence_penalty or r.params.frequency_penalty]
        self.sampled = [i for i, r in enumerate(rows) if r.params.do_sample]
        self.pad_lengths = pad_lengths
        self.prompt_width = len(rows[0].prompt_ids) + pad_lengths[0]
        self.rows = rows
        self.detailed = [r.params.details for r in rows]
        self.logprobs: torch.Tensor | None = None
        """This step's log-probabilities (after the penalties, before sampling) where a row asked
        for details."""
        if self.penalized:
            self.penalties = torch.tensor([rows[i].params.repetition_penalty for i in self.penalized], device=device)
        if self.additive:
            self.presence = torch.tensor([rows[i].params.presence_penalty for i in self.additive], device=device)
            self.frequency = torch.tensor([rows[i].params.frequency_penalty for i in self.additive], device=device)
        if self.sampled:
            pick = [rows[i] for i in self.sampled]
            self.temperature = torch.tensor([r.params.temperature for r in pick], device=device)
            self.typical_p = torch.tensor([r.params.typical_p for r in pick], device=device)
            self.top_k = torch.tensor([r.params.top_k for r in pick], device=device)
            self.top_p = torch.tensor([r.params.top_p for r in pick], device=device)
            self.min_p = torch.tensor([r.params.min_p for r in pick], device=device)
            self.generators = [make_generator(r.params.seed, device) for r in pick]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        positions = torch.arange(input_ids.shape[1], device=scores.device).unsqueeze(0)
        if self.penalized:  # over prompt and output, as transformers does
            rows = torch.tensor(self.penalized, device=scores.device)
            starts = torch.tensor([self.pad_lengths[i] for i in self.penalized], device=scores.device).unsqueeze(1)
            scores[rows] = apply_penalties(
                scores[rows], input_ids[rows], positions >= starts, repetition=self.penalties
            )
        if self.additive:  # over the output only, as OpenAI does
            rows = torch.tensor(self.additive, device=scores.device)
            output = (positions >= self.prompt_width).expand(len(self.additive), -1)
            scores[rows] = apply_penalties(
                scores[rows], input_ids[rows], output, presence=self.presence, frequency=self.frequency
            )
        generated = input_ids.shape[1] - self.prompt_width
        for i, row in enumerate(self.rows):  # no end before min_new_tokens
            if generated < row.params.min_new_tokens:
                banned = [*([] if row.params.ignore_eos_token else self.eos_ids), *row.params.stop_token_ids]
                scores[i, banned] = float("-inf")
        if any(self.detailed):
            self.logprobs = torch.log_softmax(scores.float(), dim=-1)
        if self.sampled:  # in the engine's order: temperature, typical-p, top-k, top-p, min-p
            rows = torch.tensor(self.sampled, device=scores.device)
            logits = apply_temperature(scores[rows], self.temperature)
            logits = apply_typical_p(logits, self.typical_p)
            logits = apply_top_k_top_p_min_p(logits, self.top_k, self.top_p, self.min_p)
            tokens = sample_rows(torch.softmax(logits, dim=-1), self.generators)
            chosen = torch.full_like(logits, float("-inf"))
            chosen.scatter_(1, tokens.unsqueeze(1), 0.0)
            scores[rows] = chosen
        return scores

    def chosen_logprobs(self, tokens: list[int]) -> list[float | None]:
        """Each row's log-probability of the token it got this step (None where not asked)."""
        if self.logprobs is None:
            return [None] * len(tokens)
        picked = self.logprobs.gather(1, torch.tensor(tokens, device=self.logprobs.device).unsqueeze(1))
        return [float(v) if want else None for v, want in zip(picked.squeeze(1).tolist(), self.detailed)]

    def top_tokens(self) -> list[list[tuple[int, float]] | None]:
        """Each row's ``top_n_tokens`` most likely tokens this step (None where not asked)."""
        wanted = [r.params.top_n_tokens if want else 0 for r, want in zip(self.rows, self.detailed)]
        if self.logprobs is None or not any(wanted):
            return [None] * len(self.rows)
        values, indices = self.logprobs.topk(max(wanted), dim=-1)
        return [
            list(zip(ids[:k], lps[:k])) if k else None for ids, lps, k in zip(indices.tolist(), values.tolist(), wanted)
        ]


class BatchGenerator:
    """Runs :class:`GenRow` batches through a transformers causal LM."""

    def __init__(self, model: Any, tokenizer: Any, eos_ids: Sequence[int], pad_id: int):
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_ids)
        self.pad_id = pad_id
        self.device = next(model.parameters()).device

    def run(self, rows: list[GenRow], on_step: StepCallback | None = None) -> list[RowResult]:
        width = max(len(r.prompt_ids) for r in rows)
        pad_lengths = [width - len(r.prompt_ids) for r in rows]
        input_ids = torch.tensor(
            [[self.pad_id] * pad + r.prompt_ids for r, pad in zip(rows, pad_lengths)], device=self.device
        )
        attention = torch.tensor(
            [[0] * pad + [1] * len(r.prompt_ids) for r, pad in zip(rows, pad_lengths)], device=self.device
        )
        states = [_RowState(r, self.tokenizer) for r in rows]
        config = GenerationConfig(
            max_new_tokens=max(r.params.max_new_tokens for r in rows),
            do_sample=False,
            num_beams=1,
            eos_token_id=[],  # none (None would take the model's): each row ends as _RowTracker says
            pad_token_id=self.pad_id,
        )
        sampler = _RowSampler(rows, pad_lengths, self.device, self.eos_ids)
        with torch.inference_mode():
            self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                generation_config=config,
                logits_processor=LogitsProcessorList([sampler]),
                stopping_criteria=StoppingCriteriaList([_RowTracker(states, self.eos_ids, on_step, sampler)]),
            )
        return [RowResult(s.text, s.finish_reason or "length", s.tokens) for s in states]

    def prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        """Each prompt token's log-probability given the ones before it (one forward pass)."""
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0]
        logprobs = torch.log_softmax(logits[:-1].float(), dim=-1)
        picked = logprobs.gather(1, torch.tensor(ids[1:], device=self.device).unsqueeze(1)).squeeze(1)
        return [None, *picked.tolist()]
