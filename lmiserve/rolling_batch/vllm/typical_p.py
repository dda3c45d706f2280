"""``typical_p`` on ``option.rolling_batch=vllm``: a logits processor of vLLM's V1 interface, given to
the engine by class path at start (:data:`~.params.TYPICAL_P_PROCESSOR`). A request carries its mass
in ``SamplingParams.extra_args``; the processor keeps, in those requests' rows, the tokens lmiserve's
own engine keeps (:func:`~lmiserve.generation.sampling.apply_typical_p`), judged at the request's
temperature (vLLM runs custom processors before it applies temperature), and masks the rest.

Imported only in vLLM's engine process, where vLLM is installed."""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ...generation.sampling import apply_typical_p
from .params import TYPICAL_P_KEY


class TypicalP(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[float, float]] = {}
        """Batch index -> (mass, temperature) of the requests that ask for typical_p."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        mass = (getattr(sampling_params, "extra_args", None) or {}).get(TYPICAL_P_KEY)
        if mass is not None and not 0.0 < float(mass) <= 1.0:
            raise ValueError(f"typical_p must be in (0, 1], got {mass}")

    def is_argmax_invariant(self) -> bool:
        return False  # the most likely token may lie outside the typical set

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _, _ in batch_update.added:
            mass = (getattr(params, "extra_args", None) or {}).get(TYPICAL_P_KEY)
            if mass is not None and float(mass) < 1.0:
                self.rows[index] = (float(mass), float(params.temperature) or 1.0)
            else:
                self.rows.pop(index, None)
        for a, b, direction in batch_update.moved:
            at_a, at_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if at_a is not None:
                self.rows[b] = at_a
            if direction == MoveDirectionality.SWAP and at_b is not None:
                self.rows[a] = at_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        indices = sorted(i for i in self.rows if i < logits.shape[0])
        if not indices:
            return logits
        rows = torch.tensor(indices, device=logits.device)
        mass = torch.tensor([self.rows[i][0] for i in indices], device=logits.device)
        temperature = torch.tensor([self.rows[i][1] for i in indices], device=logits.device).unsqueeze(1)
        picked = logits[rows]
        kept = apply_typical_p(picked / temperature.to(picked.dtype), mass)
        logits[rows] = torch.where(torch.isfinite(kept), picked, kept)
        return logits
