"""Deterministic mode: ops whose result for a token does not depend on the rest of the step.

What changes a token's rounding with the batch, and what is done about it here:

- Matrix multiplies choose their kernel and blocking by the number of rows (oneDNN, MKL and
  cuBLAS all do), so a row's sums are added in another order in a larger batch. Kernels that
  form each row's sums in one order whatever the other rows (the CPU's bf16 linear and LoRA
  kernels, which the CPU ops pick in this mode wherever they are built) run the whole step at
  once. Every other multiply runs on blocks of exactly :data:`ROWS` rows (the last one
  padded): the same kernel, the same order, for every row, whatever else is in the step.
- Attention over a prompt chunk is computed by tiles of queries, so a token's result depends on
  how its prompt was chunked and on whether its prefix came from the cache. Here every query
  token is attended on its own, as a decode would be: over its own keys in position order, with
  the device's decode kernel (which splits keys across programs, if at all, only at fixed
  positions, and folds the parts in a fixed order).
- Row-wise reductions (RMSNorm, log-sum-exp) are per row in the CPU and CUDA kernels; the plain
  torch versions (fp32, the reference ops) are given blocks of :data:`ROWS` rows too.

On CUDA (the Triton ops) neither blocks nor expansion are needed, and both cost a launch per
block or per token and host reads of the lengths: every linear layer (the LM head included) is
one launch of a matrix multiply with a single fixed tiling and no split of the inner dimension
(:mod:`.triton_kernels.invariant_matmul`; for quantized weights the int4 and fp8 kernels in
such a tiling, never ``_scaled_mm``: :mod:`.cuda_quant`), and attention is one launch of the
paged kernel over every row, decodes included, with its query tile pinned
(:data:`.triton_kernels.attention.INVARIANT_BLOCK_M`). Both are sized from shapes and ``max_q_len`` alone, so these steps can be
captured as graphs, prompt chunks included.

Sampling is already per row, with per-request generators. Different dtypes, devices or kernel
libraries still give different answers: the mode fixes the order of operations, not the hardware.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .interface import ROW_INVARIANT_PACKINGS, Ops, OpsWrapper
from .metadata import PagedAttentionInputs
from .reference import LinearWeight

ROWS = 16
"""Rows per matrix multiply: a decode batch of up to 16 costs one block; larger steps run
several, each reading weights that are by then in the cache."""

_PER_ROW_KERNELS = ("cpu", "cuda")
_HALF = (torch.float16, torch.bfloat16)


def _rows_apart(x: torch.Tensor, w: LinearWeight) -> bool:
    """Whether ``w``'s kernel forms each row of ``x`` on its own (see :data:`ROW_INVARIANT_PACKINGS`)."""
    return w.packing in ROW_INVARIANT_PACKINGS and (x.dtype == torch.bfloat16 or w.packing.startswith("gguf"))


def in_blocks(fn, x: torch.Tensor, *args):  # type: ignore[no-untyped-def]
    """``fn`` over ``x`` (rows on the first dimension) in blocks of exactly ROWS rows."""
    rows = x.shape[0]
    if rows == 0:
        return fn(x, *args)
    pad = (-rows) % ROWS
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 1) + (0, pad))
    outs = [fn(x[i : i + ROWS], *args) for i in range(0, rows + pad, ROWS)]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts)[:rows] for parts in zip(*outs))
    return torch.cat(outs)[:rows]


class BatchInvariantOps(OpsWrapper):
    """Wraps an ops implementation; everything not overridden here is the implementation's own."""

    def __init__(self, inner: Ops):
        super().__init__(inner)
        self._expanded: tuple[object, object] | None = None
        self._cuda = inner.name == "cuda"

    # --- rows ---------------------------------------------------------------------------------
    def linear(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        if self._cuda:
            return self.inner.invariant_linear(x, w)  # type: ignore[attr-defined]
        if _rows_apart(x, w):
            return self.inner.linear(x, w)
        shape = x.shape
        y = in_blocks(self.inner.linear, x.reshape(-1, shape[-1]).contiguous(), w)
        return y.view(*shape[:-1], y.shape[-1])

    def gate_up_swiglu(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        if _rows_apart(x, w):
            return self.inner.gate_up_swiglu(x, w)
        return self.inner.swiglu(self.linear(x, w))

    def _per_row(self, x: torch.Tensor) -> bool:
        return self.inner.name in _PER_ROW_KERNELS and x.dtype in _HALF

    def rms_norm(self, x, weight, eps):  # type: ignore[no-untyped-def]
        if self._per_row(x):
            return self.inner.rms_norm(x, weight, eps)
        return in_blocks(self.inner.rms_norm, x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):  # type: ignore[no-untyped-def]
        if self._per_row(x):
            return self.inner.add_rms_norm(x, residual, weight, eps)
        h = residual + x
        return in_blocks(self.inner.rms_norm, h, weight, eps)[0], h

    def argmax_logsumexp(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inner.name == "cpu" and self.kernels:
            return self.inner.argmax_logsumexp(logits)  # one row per task in the C++ kernel
        return in_blocks(self.inner.argmax_logsumexp, logits)

    def lora_add(self, y, x, a, b, lora, parts=None):  # type: ignore[no-untyped-def]
        """The CPU's C++ kernel where it runs (row by row) and the CUDA kernels (per row already:
        fixed tiles, the shrink's partial sums added in a fixed order, reading the step's device
        index, which a captured graph needs); elsewhere each run's two products on blocks of
        exactly ROWS rows, like :meth:`linear`."""
        if self._cuda or (getattr(self.inner, "row_invariant", False) and self.inner.lora_kernel_takes(y, x)):
            return self.inner.lora_add(y, x, a, b, lora, parts)
        for slot, first, end in lora.segments:
            u = in_blocks(torch.mm, x[first:end].contiguous(), a[slot].t())
            y[first:end] += in_blocks(torch.mm, u, b[slot])

    # --- attention: every query token on its own ----------------------------------------------
    def attention(self, q, k_cache, v_cache, paged: PagedAttentionInputs, scale, window=0, softcap=0.0):  # type: ignore[no-untyped-def]
        if self._cuda:
            return self._cuda_attention(q, k_cache, v_cache, paged, scale, window, softcap)
        if paged.max_q_len <= 1:
            return self.inner.attention(q, k_cache, v_cache, paged, scale, window, softcap)
        return self.inner.attention(q, k_cache, v_cache, self._as_decodes(paged), scale, window, softcap)

    def _as_decodes(self, paged: PagedAttentionInputs) -> PagedAttentionInputs:
        """One decode per query token: its sequence's block table and its own length (position
        + 1). Worked out once per step (every layer gets the same inputs)."""
        cached = self._expanded
        if cached is not None and cached[0] is paged.block_tables:
            return cached[1]  # type: ignore[return-value]
        cu, lens = paged.host_cu_q_lens, paged.host_seq_lens
        counts = [b - a for a, b in zip(cu, cu[1:])]
        owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
        own_lens = [n - m + 1 + j for n, m in zip(lens, counts) for j in range(m)]
        tables = paged.block_tables.index_select(0, owner.to(paged.block_tables.device)).contiguous()
        decodes = PagedAttentionInputs.one_decode_per_row(tables, own_lens)
        self._expanded = (paged.block_tables, decodes)
        return decodes

    def _cuda_attention(self, q, k_cache, v_cache, paged: PagedAttentionInputs, scale, window, softcap=0.0):  # type: ignore[no-untyped-def]
        """Every row in one launch of the paged kernel with its fixed query tile, on the step's
        own ``cu_q_lens``: no split along the keys, nothing read from the host copies."""
        kernels = self.inner.kernels  # type: ignore[attr-defined]
        return kernels.paged_attention(
            q, k_cache, v_cache, paged.block_tables, paged.cu_q_lens, paged.seq_lens, max(1, paged.max_q_len),
            scale, window, block_m=kernels.INVARIANT_BLOCK_M, softcap=softcap,
        )  # fmt: skip
