"""The rejection rule of speculative sampling (Leviathan et al., Chen et al., 2023), which keeps the
target distribution exactly.

A proposed token ``x`` drawn from the proposer's distribution ``q`` is accepted with probability
``min(1, p(x) / q(x))``, ``p`` being the model's distribution at that row. At the first rejected
row the token is drawn from the residual ``max(p - q, 0)``, normalised; a row without a proposal
(the bonus row after all were accepted) draws from ``p``. A proposer that picks its tokens
(n-gram, a greedy draft) has a one-hot ``q``: acceptance is then ``p(x)``, the residual ``p``
without ``x``.
"""

from __future__ import annotations

import torch

from ...generation.sampling import sample_rows


def rejection_rows(
    p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor, generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``p`` (rows, vocab): whether its proposal ``draft[r]`` (-1: none) is accepted,
    and the token the run ends with should it end at that row (residual draw, or ``p``'s where there
    is no proposal). ``q``: the proposer's distributions (None: one-hot at the proposals). Each row
    draws from ``generators[r]``: a uniform number, then its ending token."""
    rows = p.shape[0]
    has = draft >= 0
    index = draft.clamp(min=0).unsqueeze(1)
    p_x = p.gather(1, index).squeeze(1)
    if q is None:
        ratio = p_x
        residual = p.scatter(1, index, 0.0)
    else:
        q_x = q.gather(1, index).squeeze(1)
        ratio = torch.where(q_x > 0, p_x / q_x.clamp(min=1e-30), torch.ones_like(p_x))
        residual = (p - q).clamp(min=0.0)
    uniform = torch.cat([torch.rand(1, generator=g, device=g.device) for g in generators]).to(p.device)
    accept = has & (uniform < ratio)
    residual = torch.where(has.unsqueeze(1), residual, p)
    total = residual.sum(dim=1, keepdim=True)
    # an empty residual (p equals q where q is positive) is never drawn from: the row accepts
    residual = torch.where(total > 0, residual / total.clamp(min=1e-30), p)
    stop = sample_rows(residual, generators[:rows])
    return accept, stop
