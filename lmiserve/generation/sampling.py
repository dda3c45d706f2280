"""Batched logit processing and sampling with per-row parameters.

Every function takes a ``(rows, vocab)`` float32 logits tensor and per-row parameter
tensors, and works in place where it can. Rows whose parameter is neutral are left exactly
as they were, so greedy rows are unaffected by sampling rows in the same batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NEG_INF = float("-inf")


def apply_penalties(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    token_mask: torch.Tensor,
    repetition: torch.Tensor | None = None,
    presence: torch.Tensor | None = None,
    frequency: torch.Tensor | None = None,
) -> torch.Tensor:
    """Repetition (multiplicative, HF/CTRL style), presence and frequency (additive, OpenAI style)
    penalties over the tokens each row has seen. ``token_ids``/``token_mask`` are ``(rows, n)``
    padded id lists; padded positions have mask False."""
    rows, vocab = logits.shape
    counts = torch.zeros((rows, vocab), dtype=logits.dtype, device=logits.device)
    counts.scatter_add_(1, token_ids.clamp(min=0), token_mask.to(logits.dtype))
    seen = counts > 0
    if repetition is not None:
        rep = repetition.to(logits.dtype).unsqueeze(1)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
    if frequency is not None:
        logits = logits - frequency.to(logits.dtype).unsqueeze(1) * counts
    if presence is not None:
        logits = logits - presence.to(logits.dtype).unsqueeze(1) * seen.to(logits.dtype)
    return logits


MIN_TEMPERATURE = 1e-5


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Each row divided by its temperature. Rows are shifted to a maximum of 0 first and the
    temperature floored at ``MIN_TEMPERATURE``, so that a tiny (even subnormal) temperature gives a
    near-greedy distribution rather than inf or NaN scores (softmax is unchanged by the shift)."""
    t = temperature.to(logits.dtype).clamp(min=MIN_TEMPERATURE).unsqueeze(1)
    return (logits - logits.amax(dim=-1, keepdim=True)) / t


def apply_top_k_top_p_min_p(
    logits: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k / nucleus / min-p set.

    ``top_k`` <= 0 means no limit; ``top_p`` >= 1 and ``min_p`` <= 0 are neutral.
    At least the most likely token always survives.
    """
    if top_k is None and top_p is None and min_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    positions = torch.arange(vocab, device=logits.device).unsqueeze(0)
    if top_k is not None:
        k = torch.where(top_k <= 0, torch.full_like(top_k, vocab), top_k).clamp(max=vocab)
        remove |= positions >= k.unsqueeze(1)
    if top_p is not None or min_p is not None:
        probs = torch.softmax(sorted_logits.masked_fill(remove, NEG_INF), dim=-1)
        if top_p is not None:
            cumulative = probs.cumsum(dim=-1)
            remove |= (cumulative - probs) > top_p.to(probs.dtype).unsqueeze(1)
        if min_p is not None:
            threshold = probs[:, :1] * min_p.to(probs.dtype).unsqueeze(1)
            remove |= probs < threshold
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_typical_p(logits: torch.Tensor, typical_p: torch.Tensor) -> torch.Tensor:
    """Locally typical sampling: keep the tokens whose information content is closest to the
    distribution's entropy, up to mass ``typical_p`` (>= 1 is neutral)."""
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    entropy = -(torch.nan_to_num(log_probs * probs)).sum(dim=-1, keepdim=True)
    surprise_gap = (-log_probs - entropy).abs()
    gap_sorted, order = surprise_gap.sort(dim=-1)
    probs_sorted = probs.gather(-1, order)
    cumulative = probs_sorted.cumsum(dim=-1)
    keep_sorted = (cumulative - probs_sorted) < typical_p.to(probs.dtype).unsqueeze(1)
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
    neutral = (typical_p >= 1.0).unsqueeze(1)
    return torch.where(keep | neutral, logits, torch.full_like(logits, NEG_INF))


def sample_rows(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One token per row from ``probs``; each row draws from its own generator, so a seeded
    request gets the same tokens whatever else is in the batch."""
    out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    for row, generator in enumerate(generators):
        out[row] = torch.multinomial(probs[row], 1, generator=generator)[0]
    return out


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
