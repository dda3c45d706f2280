"""Every kernel specialisation a request can reach, compiled before the engine says it is ready.

A step's kernels are chosen by its *kind*: a captured bucket (``("decode", b)``, ``("mixed",
(b, p))``: capturing them compiles them) or an eager step, ``("eager", attention, adapters)``,
where ``attention`` is ``"decode"`` (one query row per sequence: the attention kernel's small
tile) or ``"prompt"`` (its prompt tile) and ``adapters`` says whether LoRA products run. The LoRA
kernels have one tile size for every step and integers fixed by the projection shapes
(:mod:`..ops.triton_kernels.lora`), so any step with adapters, eager or replayed, launches what
the capture (graphs built with LoRA on run the launches over empty segments) and the eager
adapter steps here compiled. Nothing else about a step changes what is compiled: the kernels'
batch-dependent integers are not specialised on (``do_not_specialize``) and the packed index
arrays start 16-byte aligned (:mod:`.step_inputs`). :func:`warm_up` runs one eager step of each kind over KV slot -1, which
stores nothing, and returns the kinds it ran.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from .step_inputs import StepArrays

StepKey = tuple[Any, ...]


class Runner(Protocol):
    """What the warm-up needs of the model runner."""

    model: Any
    block_size: int
    max_model_len: int
    device: str

    def run_eager(self, arrays: StepArrays) -> torch.Tensor: ...


PROMPT_ROWS = 32
"""Query rows of the prompt warm-up step: past the small tiles (16 rows) of every kernel."""


def eager_key(arrays: StepArrays) -> StepKey:
    return ("eager", "decode" if arrays.max_q_len <= 1 else "prompt", arrays.lora_slots is not None)


def padding_step(num_seqs: int, q_len: int, block_size: int, adapter_slot: int | None = None) -> StepArrays:
    """``num_seqs`` sequences of ``q_len`` new tokens each (decodes when 1), every token at KV
    slot -1 over block 0; with ``adapter_slot``, every sequence uses that adapter slot."""
    tokens = num_seqs * q_len
    width = -(-q_len // block_size)
    return StepArrays(
        input_ids=np.zeros(tokens, dtype=np.int64),
        positions=np.tile(np.arange(q_len, dtype=np.int64), num_seqs),
        slots=np.full(tokens, -1, dtype=np.int64),
        block_tables=np.zeros((num_seqs, width), dtype=np.int32),
        cu_q_lens=np.arange(0, tokens + 1, q_len, dtype=np.int32),
        seq_lens=np.full(num_seqs, q_len, dtype=np.int32),
        num_decodes=num_seqs if q_len == 1 else 0,
        lora_slots=None if adapter_slot is None else np.full(num_seqs, adapter_slot, dtype=np.int32),
    )


@torch.inference_mode()
def warm_up(runner: Runner, lora: bool) -> set[StepKey]:
    """One eager decode step and one eager prompt step, each also with an adapter where
    ``lora``; the LM head runs on their last rows. The kinds run are returned."""
    q_len = max(2, min(PROMPT_ROWS, runner.max_model_len))
    ran: set[StepKey] = set()
    pool = runner.model.lora if lora else None
    held = None if pool is None else {group: set(slots) for group, slots in pool.holds.items()}
    try:
        if pool is not None:  # slot 0 adapts every projection for now: its zeros add nothing
            for slots in pool.holds.values():
                slots.add(0)
        for adapter in (None, 0) if pool is not None else (None,):
            for q in (1, q_len):
                arrays = padding_step(1, q, runner.block_size, adapter)
                hidden = runner.run_eager(arrays)
                if runner.model.lm_head is not None:
                    runner.model.logits(hidden[-1:])
                ran.add(eager_key(arrays))
    finally:
        if pool is not None and held is not None:
            pool.holds = held
    if runner.device.startswith("cuda"):
        torch.cuda.synchronize()
    return ran
