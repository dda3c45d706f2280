"""On a CPU: what a prompt token costs beside a decode step, and so the prompt share of a step
that decodes (``option.decode_step_prefill_tokens_per_sequence`` when it is left empty).

A step that decodes a full batch (:data:`DECODE_ROWS` sequences) and carries
the whole per-sequence share of prompt tokens should take about :data:`PROMPT_COST_RATIO` times as
long for its prompt tokens as for its decodes: every stream waits for the step, so the ratio bounds
how much longer a token takes while prompts arrive, and a larger share prefills the arriving
prompts in fewer steps (a shorter first token, fewer slots idle). Which share that is depends on
the CPU: with AMX tiles a prompt token's matrix products cost little beside a decode step's weight
reads, with AVX2's FMAs several times more. So it is measured at start-up, with the model's linear
layers as the engine will run them (dtype, GGUF blocks or dense weights): at
:data:`DECODE_ROWS` rows (the decode step) and at :data:`CHUNK_ROWS` rows, whose
difference per row is a prompt token's cost. Measured once per model shape and machine, then read
from a cache. Attention and the rest of a step are not measured; they add to both about alike.
Placement (:mod:`.placement`) takes the larger of this and the device's default (4, tuned on an
AMD EPYC with AVX512_BF16, where a prompt token costs about as much beside a decode step as the
AVX-512 and AVX2 classes measure): the measurement raises the share where prompt tokens are cheap.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from ..ops.cpu_dtype import (
    Layer,
    cache_file,
    load_measurement,
    model_layers,
    sample_layers,
    save_measurement,
    time_layers,
)

log = logging.getLogger("lmiserve.engine")

PROMPT_COST_RATIO = 2.0
"""A full batch's prompt tokens cost this many times its decode step's linear layers. On a 2-core
Xeon with AMX it gives a share of 8 (the AVX-512 and AVX2 classes: 2, so the default 4 stays):
there the inter-token p99 at 32 streams stays under vLLM-CPU's, and 8 streams get 14% more tokens
per second than with the share of 4 (a share of 12: 18%, but an inter-token p99 past vLLM's)."""
DECODE_ROWS = 16
"""Rows of the measured decode step: a full batch, which takes the whole per-sequence share (the
scheduler's ramp, :data:`~..scheduling.prompt_budget.FULL_SHARE_SEQUENCES`, ends at or below it)."""
CHUNK_ROWS = 64
"""Rows of the measured prompt chunk."""
MAX_SHARE = 32
"""The largest share chosen (a step's prompt tokens are bounded by
``option.max_decode_step_prefill_tokens`` as well)."""


def share_of(decode_s: float, chunk_s: float) -> int:
    """The per-sequence share from the linear layers' time at :data:`DECODE_ROWS` rows
    and at :data:`CHUNK_ROWS` rows: the prompt tokens per sequence whose cost at full share is
    :data:`PROMPT_COST_RATIO` times the decode step's."""
    per_token = (chunk_s - decode_s) / (CHUNK_ROWS - DECODE_ROWS)
    if per_token <= 0.0:
        return MAX_SHARE
    share = PROMPT_COST_RATIO * decode_s / (DECODE_ROWS * per_token)
    return max(1, min(MAX_SHARE, round(share)))


def _as_run(layers: list[Layer], rows: int, dense_rows: int) -> list[Layer]:
    """The layers as the engine runs them at ``rows`` rows: dense from ``dense_rows`` on (0: never)."""
    return [x.dense() for x in layers] if dense_rows and rows >= dense_rows else layers


def measure_share(
    layers: list[Layer], count: int, dtype: torch.dtype, dense_rows: int, ops
) -> tuple[int, float, float]:  # type: ignore[no-untyped-def]
    """(the share, the linear layers' seconds at a decode step, at a chunk), over as many decoder
    layers as 64 MiB of bf16 weights hold."""
    sample = sample_layers(layers, count, as_dense=True)
    at = {rows: time_layers(ops, _as_run(sample, rows, dense_rows), dtype, rows) for rows in (DECODE_ROWS, CHUNK_ROWS)}
    decode_s, chunk_s = at[DECODE_ROWS], at[CHUNK_ROWS]
    return share_of(decode_s, chunk_s), decode_s, chunk_s


def measured_share(
    model_dir: Path, dtype: str, dense_rows: int = 0, quantize: str | None = None, int8_activations: bool = False
) -> tuple[int | None, str]:
    """The prompt share for this model on this CPU (its block layers against int8 activations
    where ``int8_activations``), and why (None where the model's shapes cannot be read: the
    device's default stays)."""
    from ..ops.cpu import CpuOps

    try:
        layers, count, _ = model_layers(model_dir, quantize)
    except (OSError, KeyError, ValueError) as exc:
        return None, f"the prompt share is the default (the model's shapes were not read: {exc})"
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    if dtype not in ("bf16", "fp32"):
        return None, f"the prompt share is the default ({dtype} is not measured)"
    method = ["prompt-share", dtype, dense_rows, DECODE_ROWS, CHUNK_ROWS, PROMPT_COST_RATIO, MAX_SHARE]
    if int8_activations:
        method.append("int8-activations")
    cached = cache_file(layers, count, None, True, method)
    saved = load_measurement(cached)
    try:
        share, decode_s, chunk_s = int(saved["share"]), float(saved["decode_s"]), float(saved["chunk_s"])
        return share, _why(share, decode_s, chunk_s) + f" (measured at an earlier start, {cached})"
    except (ValueError, KeyError, TypeError):
        pass
    ops = CpuOps(int8_activations=int8_activations)  # builds the kernels where needed: not measured
    start = time.perf_counter()
    share, decode_s, chunk_s = measure_share(layers, count, torch_dtype, dense_rows, ops)
    log.info("the prompt share measured in %.2f s", time.perf_counter() - start)
    save_measurement(cached, {"share": share, "decode_s": decode_s, "chunk_s": chunk_s})
    return share, _why(share, decode_s, chunk_s)


def _why(share: int, decode_s: float, chunk_s: float) -> str:
    per_token = (chunk_s - decode_s) / (CHUNK_ROWS - DECODE_ROWS)
    return (
        f"prompt share {share} tokens per sequence, measured: linear layers at {DECODE_ROWS} rows "
        f"{decode_s * 1e3:.2f} ms, {per_token * 1e6:.1f} us more per prompt row (a full batch's share costs "
        f"{PROMPT_COST_RATIO:g}x its decodes)"
    )
