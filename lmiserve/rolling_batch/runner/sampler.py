"""Choosing each sequence's next token from its logits, with per-request parameters.

Rows are processed together; parameters that are neutral for a row leave it untouched, so a
greedy request gets exactly the argmax whatever else is in the batch, and a seeded request
draws from its own generator, so it gets the same tokens whatever else is in the batch.
Log-probabilities are those of the model's distribution (before temperature and filtering).
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch

from ...generation.sampling import (
    apply_penalties,
    apply_temperature,
    apply_top_k_top_p_min_p,
    apply_typical_p,
    sample_rows,
)
from ..scheduling.scheduler import ScheduledSeq
from ..scheduling.sequence import Group, Sequence
from . import replay


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None
    """Per row, the ``k`` most likely tokens with log-probabilities (when any row asked)."""


@dataclass
class DeviceSamples:
    """Sampled tokens still on the device: ``tokens`` (int64, a row each) for a step that takes them
    as its input ids, and ``packed`` (float64) holding everything the host reads, so that one copy
    brings it over: the tokens, their log-probabilities, then, when ``k > 0``, each row's ``k`` most
    likely token ids and their log-probabilities."""

    tokens: torch.Tensor
    packed: torch.Tensor
    k: int = 0

    def on_host(self, values: list[float], seqs: Seq[Sequence]) -> SampleResult:
        """The result from ``packed`` read back as ``values`` (row i belongs to ``seqs[i]``)."""
        n, k = len(seqs), self.k
        top = None
        if k > 0:
            ids, lps = values[2 * n : 2 * n + n * k], values[2 * n + n * k :]
            top = [[(int(ids[i * k + j]), lps[i * k + j]) for j in range(seqs[i].params.logprobs)] for i in range(n)]
        return SampleResult([int(t) for t in values[:n]], values[n : 2 * n], top)


@dataclass
class LogitRows:
    """Which rows of a step's hidden states get logits: first one per sequence that samples
    (in ``sampled`` order), then the prompt rows of sequences that asked for prompt log-probabilities."""

    sampled: list[ScheduledSeq] = field(default_factory=list)
    hidden_rows: list[int] = field(default_factory=list)
    prompt_rows: dict[int, tuple[int, int]] = field(default_factory=dict)
    """seq_id -> (first logits row, count): rows predicting the chunk's next prompt tokens."""
    verified: list[tuple[ScheduledSeq, int]] = field(default_factory=list)
    """Verify runs and the first of their logits rows (after the sampled rows: one per token run;
    their hidden rows follow the decodes')."""

    @classmethod
    def of(
        cls, decodes: list[ScheduledSeq], prefills: list[ScheduledSeq], verifies: list[ScheduledSeq] = ()
    ) -> LogitRows:
        rows = cls()
        prompt_spans: list[tuple[int, int, int]] = []  # (seq_id, first hidden row, count)
        for i, item in enumerate(decodes):
            if item.samples:
                rows.sampled.append(item)
                rows.hidden_rows.append(i)
        offset = len(decodes) + sum(item.num_tokens for item in verifies)
        for item in prefills:
            seq = item.seq
            if seq.params.prompt_logprobs is not None and item.start < seq.num_prompt_tokens:
                prompt_spans.append((seq.seq_id, offset, min(item.num_tokens, seq.num_prompt_tokens - item.start)))
            if item.samples:
                rows.sampled.append(item)
                rows.hidden_rows.append(offset + item.num_tokens - 1)
            offset += item.num_tokens
        offset = len(decodes)  # a verify run's rows follow the decodes (as decodes)
        for item in verifies:
            rows.verified.append((item, len(rows.hidden_rows)))
            rows.hidden_rows.extend(range(offset, offset + item.num_tokens))
            offset += item.num_tokens
        for seq_id, first, count in prompt_spans:
            rows.prompt_rows[seq_id] = (len(rows.hidden_rows), count)
            rows.hidden_rows.extend(range(first, first + count))
        return rows


@dataclass
class StepResult:
    """What a step produced, worked out before anything outside the device changes (so a failed
    step can be run again): the sampled tokens, the beams' log-probabilities, prompt log-probabilities."""

    seqs: list[Sequence] = field(default_factory=list)
    """The sequences that got a token (beam searches aside), in the order of ``samples``."""
    samples: SampleResult | None = None
    beams: dict[Group, torch.Tensor] = field(default_factory=dict)
    """Per beam-search request: log-probabilities of its running beams' next tokens, a row each."""
    prompt_logprobs: dict[Sequence, tuple[list, list]] = field(default_factory=dict)
    """Per sequence that asked: this step's prompt log-probabilities and top alternatives."""
    verified: list[Any] = field(default_factory=list)
    """Per verify run, the tokens it keeps (``verify.Checked``)."""


def _ban_bad_words(scores: torch.Tensor, seqs: Seq[Sequence]) -> None:
    """Each bad word's last token banned where the output so far ends with the tokens before it."""
    for i, s in enumerate(seqs):
        if not s.params.bad_word_ids:
            continue
        output = s.token_ids[s.num_prompt_tokens :]
        banned = [w[-1] for w in s.params.bad_word_ids if len(w) == 1 or output[-(len(w) - 1) :] == w[:-1]]
        if banned:
            scores[i, banned] = float("-inf")


def _penalized(seqs: Seq[Sequence]) -> list[int]:
    return [
        i
        for i, s in enumerate(seqs)
        if s.params.repetition_penalty != 1.0 or s.params.presence_penalty or s.params.frequency_penalty
    ]


class Sampler:
    def __init__(self, device: str, ops=None, guided=None):  # type: ignore[no-untyped-def]
        self.device = device
        self.ops = ops
        self.guided = guided
        self.generators: dict[int, torch.Generator] = {}

    def generator_for(self, seq: Sequence, row: torch.Tensor | None = None) -> torch.Generator:
        """``seq``'s generator; a seeded one made for a replay is advanced past the draws of its
        replayed tokens (``row``: a row of probabilities as the sequence draws from)."""
        gen = self.generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            seed = seq.params.seed
            if seed is None:
                gen.seed()
            else:
                gen.manual_seed((seed + seq.index) % 2**63)
                if seq.num_replayed and row is not None:
                    replay.advance(gen, row, seq.num_replayed)
            self.generators[seq.seq_id] = gen
        return gen

    def forget(self, seq: Sequence) -> None:
        self.generators.pop(seq.seq_id, None)
        if self.guided is not None:
            self.guided.forget(seq)

    def _apply_penalties(self, logits: torch.Tensor, seqs: Seq[Sequence], rows: list[int]) -> None:
        """Repetition penalty over prompt and output (as transformers does); presence and
        frequency penalties over the output only (as OpenAI does)."""
        dev = logits.device
        sub = logits[rows]
        rep = [seqs[i].params.repetition_penalty for i in rows]
        if any(r != 1.0 for r in rep):
            histories = [seqs[i].token_ids for i in rows]
            ids, mask = _pad(histories, dev)
            sub = apply_penalties(sub, ids, mask, repetition=torch.tensor(rep, device=dev))
        pres = [seqs[i].params.presence_penalty for i in rows]
        freq = [seqs[i].params.frequency_penalty for i in rows]
        if any(pres) or any(freq):
            outputs = [seqs[i].token_ids[seqs[i].num_prompt_tokens :] for i in rows]
            ids, mask = _pad(outputs, dev)
            sub = apply_penalties(
                sub, ids, mask, presence=torch.tensor(pres, device=dev), frequency=torch.tensor(freq, device=dev)
            )
        logits[rows] = sub

    def _suppress_early_stop(self, logits: torch.Tensor, seqs: Seq[Sequence], eos: Seq[int]) -> None:
        for i, s in enumerate(seqs):
            if s.num_generated < s.params.min_new_tokens:
                banned = list(s.params.stop_token_ids) + ([] if s.params.ignore_eos else list(eos))
                if banned:
                    logits[i, banned] = float("-inf")

    def step(self, logits: torch.Tensor, rows: LogitRows, prefills: list[ScheduledSeq], eos: Seq[int]) -> StepResult:
        """The step's tokens from its logits (rows as ``rows`` chose them)."""
        result = StepResult(prompt_logprobs=self._prompt_logprobs(logits, rows, prefills))
        sample_logits = logits[: len(rows.sampled)]
        index: dict[int, int] = {}  # seq_id -> row, made when a beam search needs it
        keep: list[int] = []
        for i, item in enumerate(rows.sampled):
            group = item.seq.group
            if group.beam is None:
                result.seqs.append(item.seq)
                keep.append(i)
            elif group not in result.beams:
                index = index or {item.seq.seq_id: i for i, item in enumerate(rows.sampled)}
                beams = torch.tensor([index[s.seq_id] for s in group.beam.running], device=logits.device)
                result.beams[group] = torch.log_softmax(sample_logits.index_select(0, beams).float(), dim=-1)
        if result.seqs:
            if len(keep) < len(rows.sampled):
                sample_logits = sample_logits.index_select(0, torch.tensor(keep, device=logits.device))
            result.samples = self.sample(sample_logits, result.seqs, eos)
        return result

    def _prompt_logprobs(
        self, logits: torch.Tensor, rows: LogitRows, prefills: list[ScheduledSeq]
    ) -> dict[Sequence, tuple[list, list]]:
        """This step's prompt log-probabilities (and top alternatives) per sequence that asked."""
        found: dict[Sequence, tuple[list, list]] = {}
        for item in prefills:
            seq = item.seq
            if seq.seq_id not in rows.prompt_rows:
                continue
            first, count = rows.prompt_rows[seq.seq_id]
            targets, picked = [], []
            for r in range(count):
                pos = item.start + r
                if pos + 1 < seq.num_prompt_tokens:
                    targets.append(seq.token_ids[pos + 1])
                    picked.append(first + r)
            if targets:
                values, top = self.prompt_logprobs(logits[picked], targets, seq.params.prompt_logprobs or 0)
                found[seq] = (values, top or [])
        return found

    def sample(self, logits: torch.Tensor, seqs: Seq[Sequence], eos_token_ids: Seq[int] = ()) -> SampleResult:
        """One token per row of ``logits`` (row i belongs to ``seqs[i]``)."""
        drawn = self.sample_on_device(logits, seqs, eos_token_ids)
        return drawn.on_host(drawn.packed.tolist(), seqs)  # one read of the device

    def sample_on_device(
        self, logits: torch.Tensor, seqs: Seq[Sequence], eos_token_ids: Seq[int] = ()
    ) -> DeviceSamples:
        """:meth:`sample` without reading the device: the tokens stay where the logits are."""
        argmax, lse = self.ops.argmax_logsumexp(logits) if self.ops else _argmax_logsumexp(logits)
        lse = lse.unsqueeze(1)
        scores = logits
        penalized = _penalized(seqs)
        guided = self.guided is not None and any(s.params.guided is not None for s in seqs)
        if penalized or guided or any(s.params.min_new_tokens or s.params.bad_word_ids for s in seqs):
            scores = logits.clone()
            if penalized:
                self._apply_penalties(scores, seqs, penalized)
            self._suppress_early_stop(scores, seqs, eos_token_ids)
            _ban_bad_words(scores, seqs)
            if guided:
                self.guided.mask(scores, list(seqs))
            tokens = torch.argmax(scores, dim=-1)
        else:
            tokens = argmax
        sampled = [i for i, s in enumerate(seqs) if s.params.do_sample]
        if len(sampled) == len(seqs):
            tokens = self._draw(scores, list(seqs), lse)
        elif sampled:
            rows = _on_device(sampled, torch.long, logits.device)
            drawn = self._draw(scores.index_select(0, rows), [seqs[i] for i in sampled], lse.index_select(0, rows))
            tokens = tokens.index_copy(0, rows, drawn)
        # a row with a NaN or inf logit has a log-sum-exp, so a chosen log-probability, that is not
        # finite: the host finds it there (:func:`finite`), with no further work on the device
        chosen = (logits.gather(1, tokens.unsqueeze(1)) - lse).squeeze(1)
        parts = [tokens.double(), chosen.double()]  # token ids are exact in float64
        k = max(s.params.logprobs for s in seqs)
        if k > 0:
            values, indices = logits.topk(k, dim=-1)
            parts += [indices.double().ravel(), (values - lse).double().ravel()]
        return DeviceSamples(tokens, torch.cat(parts), k)

    def _draw(self, scores: torch.Tensor, seqs: list[Sequence], lse: torch.Tensor) -> torch.Tensor:
        """A token per row drawn from its sequence's generator (``lse``: each row's log-sum-exp of
        the model's logits, shape (rows, 1))."""
        probs = self.probabilities(scores, seqs, lse)
        return sample_rows(probs, [self.generator_for(s, probs[i]) for i, s in enumerate(seqs)])

    def probabilities(self, scores: torch.Tensor, seqs: Seq[Any], lse: torch.Tensor) -> torch.Tensor:
        """Each row's distribution to draw from: its sequence's temperature and filters applied. A
        row whose logits are not finite is uniform instead: its token is thrown away, and the
        others' draws are not disturbed."""
        dev = scores.device
        params = [s.params for s in seqs]

        def column(values: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return _on_device(values, dtype, dev)

        scores = apply_temperature(scores, column([p.temperature for p in params]))
        if any(p.typical_p < 1.0 for p in params):
            scores = apply_typical_p(scores, column([p.typical_p for p in params]))
        top_k = column([p.top_k for p in params], torch.long) if any(p.top_k > 0 for p in params) else None
        top_p = column([p.top_p for p in params]) if any(p.top_p < 1 for p in params) else None
        min_p = column([p.min_p for p in params]) if any(p.min_p > 0 for p in params) else None
        if min_p is None and self.ops is not None:
            scores = self.ops.top_k_top_p(scores, top_k, top_p)  # a device's fused filter where it has one
        else:
            scores = apply_top_k_top_p_min_p(scores, top_k, top_p, min_p)
        probs = torch.softmax(scores, dim=-1)
        finite = torch.isfinite(lse)
        if not bool(finite.all()):  # one flag read; each row's multinomial reads the device anyway
            probs = torch.where(finite, probs, torch.ones_like(probs))
        return probs

    def prompt_logprobs(
        self, logits: torch.Tensor, targets: list[int], k: int
    ) -> tuple[list[float], list[list[tuple[int, float]]] | None]:
        """Log-probability of each target token under the row before it, and the top ``k``."""
        lp = torch.log_softmax(logits, dim=-1)
        index = torch.tensor(targets, device=lp.device).unsqueeze(1)
        chosen = lp.gather(1, index).squeeze(1).tolist()
        top = None
        if k > 0:
            values, indices = lp.topk(k, dim=-1)
            top = [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
        return chosen, top


def finite(logprob: float) -> bool:
    """Whether a sampled token's log-probability is a number: not, when its row of logits held a
    NaN or an infinity (the row's log-sum-exp is then NaN or infinite)."""
    return math.isfinite(logprob)


def _on_device(values: list, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """Host values on ``device`` through pinned memory, without waiting for the device (as
    ``step_inputs.device_tensor``; a plain copy would wait for the step launched before)."""
    tensor = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def _argmax_logsumexp(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.argmax(logits, dim=-1), torch.logsumexp(logits, dim=-1)


def _pad(lists: list[list[int]], device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(x) for x in lists))
    ids = torch.zeros((len(lists), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(lists), width), dtype=torch.bool, device=device)
    for i, x in enumerate(lists):
        if x:
            ids[i, : len(x)] = torch.tensor(x, device=device)
            mask[i, : len(x)] = True
    return ids, mask
