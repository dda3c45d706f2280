"""The device ops tuned for CPUs.

- Linear layers in bf16 use a C++ kernel with weights packed once for it: on AMX tiles where the
  CPU has them (``csrc/linear_amx.cpp``), else vector code that keeps the next columns' weights
  arriving while it multiplies, which a decode step (few rows, every weight read from memory)
  needs most: bf16 pairs multiplied by ``vdpbf16ps`` with AVX512_BF16 (``csrc/linear.cpp``), the
  weights widened to fp32 in registers for FMAs on AVX-512F and AVX2 (``csrc/linear_fma.cpp``),
  and on AVX512_BF16 CPUs whose ``vdpbf16ps`` is slower than those FMAs, from the number of rows
  :mod:`.cpu_linear_tiles` measures (the same bits either way).
  A row's result never depends on the other rows, which deterministic mode (``row_invariant``)
  relies on. A build without any of them (the portable class): oneDNN with weights reordered
  once into its blocked layout where it multiplies bf16, else ``F.linear``.
- Attention in bf16 and fp16 reads keys and values straight from the paged cache in C++
  kernels (compiled on first use and cached): decode in ``csrc/paged_attention.cpp``, prompts
  in ``csrc/prefill_attention.cpp`` (on AMX tiles where the CPU has them,
  ``csrc/prefill_attention_amx.cpp``). fp32 prompts use torch's SDPA.
- Mixture-of-experts layers (fp32 or bf16) run in ``csrc/moe.cpp``: the rows routed to each
  expert multiplied as one grouped product, parallel over experts and tiles of columns.
- Linear layers in GGUF blocks (Q4_0, Q4_1, Q8_0) run in ``csrc/quant_linear.cpp``, which
  dequantizes each block in registers as it streams in (the loader dequantizes the GPU formats,
  AWQ, GPTQ and FP8, for a CPU); with int8 activations in ``csrc/quant_linear_int8.cpp``.
Everything else is the reference implementation, which is also the fallback when no C++
compiler is available.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..quant.weights import BlockWeight, QuantizedWeight, is_quantized
from .cpu_kernels import (
    PACK_BATCH_HINT,
    amx_tiles,
    bf16_linear_kernel,
    can_pack,
    load_kernels,
    pack_lora_for_tiles,
)
from .cpu_linear_tiles import choose as choose_linear_tiles
from .metadata import DecodeRows, PagedAttentionInputs, PromptRows
from .reference import LinearWeight, ReferenceOps, quantized_linear

_HALF = (torch.bfloat16, torch.float16)
GGUF_KINDS = {"q4_0": 0, "q4_1": 1, "q8_0": 2}
"""The GGUF block types ``csrc/quant_linear.cpp`` runs, by its number for them."""
GGUF_PACKINGS = {f"gguf-{kind}": n for kind, n in GGUF_KINDS.items()}
INT8_PACKINGS = {f"gguf-{kind}+int8": n for kind, n in GGUF_KINDS.items()}
"""GGUF blocks against activations quantized to int8 (``csrc/quant_linear_int8.cpp``)."""
GGUF_TILE_ROWS = 4
"""With AMX: rows of bf16 x from which GGUF-block layers run on the tiles (``csrc/quant_linear_amx.cpp``)."""
LONG_RUN = 32
"""Rows from which a LoRA run is faster as two oneDNN products than in the row-by-row kernel."""
TILE_RUN = 4
"""With AMX: rows from which a LoRA run is faster on the tiles than in the row-by-row kernel (4
adapters' runs of SmolLM2's projections, per forward: 2 rows a run 2.2 ms on the tiles against
1.5, 8 rows 2.9 against 4.3, 64 rows 6.0 against 30). Deterministic mode takes the tiles for all."""


@functools.cache
def _part_cols(parts: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(parts, dtype=torch.int64)


class CpuOps(ReferenceOps):
    name = "cpu"

    def __init__(self, row_invariant: bool = False, dense_rows: int = 0, int8_activations: bool = False) -> None:
        """``row_invariant`` (deterministic mode): every LoRA run goes through one of the C++
        kernels, whose rows do not depend on each other, and GGUF blocks take one path whatever
        the number of rows. ``dense_rows``: see :attr:`dense_rows`. ``int8_activations``: GGUF
        blocks multiply activations quantized to int8 (:mod:`..quant.int8_activations`)."""
        self.kernels = load_kernels()
        self.native_formats = ("gguf",) if self.kernels else ()
        self.row_invariant = row_invariant
        self.own_linear = bf16_linear_kernel()
        self.linear_tiles = choose_linear_tiles(row_invariant) if self.own_linear else None
        """Where an AVX512_BF16 build runs its FMA tiles (:mod:`.cpu_linear_tiles`)."""
        self.tiles = self.own_linear and amx_tiles()
        """AMX tiles for bf16 linear layers and prompt attention."""
        self.gguf_tile_rows = (1 if row_invariant else GGUF_TILE_ROWS) if self.tiles else 0
        """Rows from which GGUF-block layers take the tiles (0: never); in deterministic mode all
        of them, so that no row's sums change with the batch."""
        self.dense_rows = 0 if row_invariant or not self.own_linear else dense_rows
        """Rows of bf16 x from which GGUF-block layers run from their weights dequantized to bf16,
        kept beside the blocks (0: never, none kept): where reading a third of the bytes wins a
        decode step of a few streams, but a prompt chunk or a full batch runs faster from bf16
        weights (:mod:`.cpu_gguf_rows` measures where). Not in deterministic mode."""
        self.int8_activations = int8_activations  # without kernels: the reference's definition
        self._lora_packs: dict[int, tuple[int, int, torch.Tensor, torch.Tensor]] = {}

    def _own_kernel_takes(self, weight: torch.Tensor) -> bool:
        """Whether the C++ linear kernel runs this weight: bf16, pairs of input dimensions."""
        return self.own_linear and weight.dtype == torch.bfloat16 and weight.shape[1] % 2 == 0

    def prepare_linear(self, weight, bias=None):  # type: ignore[no-untyped-def]
        if is_quantized(weight):
            return self._prepare_quantized(weight, bias)
        prepared = super().prepare_linear(weight, bias)
        if self._own_kernel_takes(weight):
            prepared.packed = torch.ops.lmiserve_cpu.pack_linear_bf16(prepared.weight)
            prepared.packing = "lmiserve"
        elif can_pack(weight):
            prepared.packed = torch.ops.mkldnn._reorder_linear_weight(prepared.weight, PACK_BATCH_HINT)
            prepared.packing = "onednn"
        return prepared

    def _prepare_quantized(
        self, weight: QuantizedWeight, bias: torch.Tensor | None, gated: bool = False
    ) -> LinearWeight:
        """GGUF blocks repacked for ``csrc/quant_linear.cpp`` (the blocks themselves are not
        kept), with their bf16 weights beside them under :attr:`dense_rows` (``gated``: packed
        for :meth:`gate_up_swiglu`); the GPU formats, which the loader dequantizes for a CPU,
        take the reference ops'."""
        if not (isinstance(weight, BlockWeight) and self.kernels):
            return quantized_linear(weight, bias)
        kind = GGUF_KINDS[weight.kind]
        if self.int8_activations:
            packed = torch.ops.lmiserve_cpu.pack_gguf_int8(weight.blocks, kind, weight.in_features)
            packing = f"gguf-{weight.kind}+int8"
        else:
            packed = torch.ops.lmiserve_cpu.pack_gguf(weight.blocks, kind, weight.in_features)
            packing = f"gguf-{weight.kind}"
        prepared = LinearWeight(torch.empty(weight.shape, device="meta"), bias, packed, packing)
        if self.dense_rows:
            dense = weight.dequantize(torch.bfloat16)
            prepared.dense = self.prepare_gate_up(dense) if gated else self.prepare_linear(dense, bias)
        return prepared

    def _dense_takes(self, x: torch.Tensor, w: LinearWeight) -> bool:
        return w.dense is not None and x.dtype == torch.bfloat16 and x.numel() >= self.dense_rows * x.shape[-1]

    def prepare_gate_up(self, weight):  # type: ignore[no-untyped-def]
        """Packed gated where the kernel runs: each group of columns holds 24 units' gate and up,
        so :meth:`gate_up_swiglu` ends with the SwiGLU and never writes gate_up out."""
        if is_quantized(weight):
            return self._prepare_quantized(weight, None, gated=True)
        if weight.shape[0] % 2 == 0 and self._own_kernel_takes(weight):
            packed = torch.ops.lmiserve_cpu.pack_linear_bf16(weight.contiguous(), True)
            return LinearWeight(weight.contiguous(), None, packed, "lmiserve-gated")
        return self.prepare_linear(weight)

    def gate_up_swiglu(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        if self._dense_takes(x, w):
            return self.gate_up_swiglu(x, w.dense)
        if w.packing == "lmiserve-gated" and x.dtype == torch.bfloat16:
            return torch.ops.lmiserve_cpu.linear_bf16(x, w.packed, None, w.weight.shape[0] // 2, 2, self.tiles)
        return super().gate_up_swiglu(x, w)

    def linear(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        if w.packing in GGUF_PACKINGS or w.packing in INT8_PACKINGS:
            if self._dense_takes(x, w):
                return self.linear(x, w.dense)
            if w.packing in INT8_PACKINGS:
                n = w.weight.shape[0]
                return torch.ops.lmiserve_cpu.linear_gguf_int8(x, w.packed, INT8_PACKINGS[w.packing], n, w.bias)
            kind = GGUF_PACKINGS[w.packing]
            return torch.ops.lmiserve_cpu.linear_gguf(x, w.packed, kind, w.bias, self.gguf_tile_rows)
        if w.packing == "lmiserve" and x.dtype == torch.bfloat16:
            return torch.ops.lmiserve_cpu.linear_bf16(x, w.packed, w.bias, w.weight.shape[0], 0, self.tiles)
        if w.packing == "lmiserve-gated" and x.dtype == torch.bfloat16:
            return torch.ops.lmiserve_cpu.linear_bf16(x, w.packed, None, w.weight.shape[0], 1, self.tiles)
        if w.packed is not None and x.dtype == torch.bfloat16:
            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            if not x2.is_contiguous():
                x2 = x2.contiguous()
            y = torch.ops.mkldnn._linear_pointwise(x2, w.packed, w.bias, "none", [], "")
            return y.view(*shape[:-1], y.shape[-1])
        return F.linear(x, w.weight, w.bias)

    def fused_moe(self, x, topk_weights, topk_ids, experts):  # type: ignore[no-untyped-def]
        """The grouped product of ``csrc/moe.cpp`` for fp32 and bf16 (rows never depend on each other)."""
        if self.kernels and x.dtype in (torch.float32, torch.bfloat16) and experts.w13.dtype == x.dtype:
            return torch.ops.lmiserve_cpu.fused_moe(
                x.contiguous(),
                topk_weights.float().contiguous(),
                topk_ids.to(torch.int32).contiguous(),
                experts.w13,
                experts.w2,
            )
        return super().fused_moe(x, topk_weights, topk_ids, experts)

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):  # type: ignore[no-untyped-def]
        """One C++ call per layer for both caches (the reference masks the -1 slots and copies twice)."""
        if (
            self.kernels
            and k.dtype == k_cache.dtype
            and v.dtype == v_cache.dtype
            and slot_mapping.dtype == torch.int64
            and k.is_contiguous()
            and v.is_contiguous()
        ):
            torch.ops.lmiserve_cpu.write_kv_(k, v, k_cache, v_cache, slot_mapping)
            return
        super().write_kv(k, v, k_cache, v_cache, slot_mapping)

    def rotate_and_store(self, qkv, heads, cos, sin, k_cache, v_cache, slot_mapping):  # type: ignore[no-untyped-def]
        """Half precision: one C++ pass (queries rotated out, keys rotated and values copied
        into their slots), no split copies."""
        if (
            self.kernels
            and qkv.dtype in _HALF
            and qkv.is_contiguous()
            and cos.dtype == qkv.dtype
            and cos.is_contiguous()
            and sin.is_contiguous()
            and slot_mapping.dtype == torch.int64
        ):
            return torch.ops.lmiserve_cpu.rotate_store_(qkv, cos, sin, k_cache, v_cache, slot_mapping, heads)
        return super().rotate_and_store(qkv, heads, cos, sin, k_cache, v_cache, slot_mapping)

    # fused element-wise ops for half-precision activations (fp32 keeps the reference ops,
    # whose rounding matches transformers step for step)
    def rms_norm(self, x, weight, eps):  # type: ignore[no-untyped-def]
        if self.kernels and x.dtype in _HALF and x.is_contiguous():
            return torch.ops.lmiserve_cpu.rms_norm(x, weight, eps)
        return super().rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):  # type: ignore[no-untyped-def]
        if self.kernels and x.dtype in _HALF and x.is_contiguous() and residual.is_contiguous():
            return torch.ops.lmiserve_cpu.add_rms_norm_(x, residual, weight, eps), residual
        return super().add_rms_norm(x, residual, weight, eps)

    def rotary(self, q, k, cos, sin, interleaved=False):  # type: ignore[no-untyped-def]
        if self.kernels and not interleaved and q.dtype in _HALF and cos.is_contiguous():
            torch.ops.lmiserve_cpu.rotary_(q, k, cos, sin)
            return q, k
        return super().rotary(q, k, cos, sin, interleaved)

    def swiglu(self, gate_up):  # type: ignore[no-untyped-def]
        if self.kernels and gate_up.dtype in _HALF and gate_up.is_contiguous():
            return torch.ops.lmiserve_cpu.swiglu(gate_up)
        return super().swiglu(gate_up)

    def lora_add(self, y, x, a, b, lora, parts=None):  # type: ignore[no-untyped-def]
        """With AMX, runs of :data:`TILE_RUN` rows or more on the tiles in one C++ call per
        projection (``csrc/lora_amx.cpp``). Otherwise short runs (decodes) in one C++ call per
        projection (``csrc/lora.cpp``), skipping the zeros between a fused projection's parts;
        long runs (prompt chunks) as two oneDNN products each, which are faster there. The
        reference products where the kernels cannot run. ``row_invariant``: every run in one of
        the C++ kernels (the tiles where there are any), whose rows do not depend on each other."""
        if self.tiles and self._lora_tiles_take(y, x, a):
            short, tiled = (None, lora) if self.row_invariant else lora.split(TILE_RUN)
            if tiled is not None:
                a_packed, b_packed = self._lora_packed(a, b)
                torch.ops.lmiserve_cpu.lora_tiles_(y, x, a_packed, b_packed, tiled.host_runs(), a.shape[1])
            if short is not None:
                torch.ops.lmiserve_cpu.lora_add_(y, x, a, b, short.host_runs(), _part_cols(parts or (0, y.shape[1])))
            return
        if not self.lora_kernel_takes(y, x):
            return super().lora_add(y, x, a, b, lora, parts)
        short, long = (lora, None) if self.row_invariant else lora.split(LONG_RUN)
        if short is not None:
            torch.ops.lmiserve_cpu.lora_add_(y, x, a, b, short.host_runs(), _part_cols(parts or (0, y.shape[1])))
        if long is not None:
            super().lora_add(y, x, a, b, long, parts)

    def lora_kernel_takes(self, y: torch.Tensor, x: torch.Tensor) -> bool:
        return self.kernels and y.is_contiguous() and x.is_contiguous()

    def _lora_tiles_take(self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor) -> bool:
        """bf16 throughout and whole tiles of input features: the AMX kernel (``csrc/lora_amx.cpp``)."""
        half = y.dtype == x.dtype == a.dtype == torch.bfloat16
        return half and x.shape[1] % 32 == 0 and self.lora_kernel_takes(y, x)

    def _lora_packed(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The pool's A and B packed for the tiles, again whenever an adapter was loaded into them
        (their version counters move with every in-place write)."""
        key = a.data_ptr()
        cached = self._lora_packs.get(key)
        if cached is None or cached[:2] != (a._version, b._version):
            cached = (a._version, b._version, *pack_lora_for_tiles(a, b))
            self._lora_packs[key] = cached
        return cached[2], cached[3]

    def argmax_logsumexp(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.kernels:
            return super().argmax_logsumexp(logits)
        return torch.ops.lmiserve_cpu.argmax_logsumexp(logits)

    def _step_attention(self, q, k_cache, v_cache, paged: PagedAttentionInputs, scale, window=0, softcap=0.0):  # type: ignore[no-untyped-def]
        """Decodes and prompt chunks each in a kernel of their own."""
        decodes, prompts = paged.parts()
        if not prompts.num_seqs:
            return self._decode(q, k_cache, v_cache, decodes, scale, window, softcap)
        if not decodes.num_seqs:
            return self._prefill(q, k_cache, v_cache, prompts, scale, window, softcap)
        nd = decodes.num_seqs
        out = torch.empty_like(q)
        out[:nd] = self._decode(q[:nd], k_cache, v_cache, decodes, scale, window, softcap)
        out[nd:] = self._prefill(q[nd:], k_cache, v_cache, prompts, scale, window, softcap)
        return out

    def _decode(self, q, k_cache, v_cache, rows: DecodeRows, scale, window, softcap=0.0):  # type: ignore[no-untyped-def]
        """One query row per sequence: the C++ kernel reading the paged cache in place."""
        if not self.kernels:
            out = torch.empty_like(q)
            for b, length in enumerate(rows.seq_lens.tolist()):
                table = rows.block_tables[b]
                out[b] = self._attend(q[b : b + 1], k_cache, v_cache, table, length, scale, window, softcap)[0]
            return out
        return torch.ops.lmiserve_cpu.paged_attention_decode(
            q, k_cache, v_cache, rows.block_tables, rows.seq_lens, scale, window, softcap
        )

    def _prefill(self, q, k_cache, v_cache, rows: PromptRows, scale, window, softcap=0.0):  # type: ignore[no-untyped-def]
        """Half precision: the C++ kernel, reading the paged cache in place (faster than torch's fused
        attention). fp32 keeps torch's, whose sums match transformers'; capped scores, which
        torch's does not take, the reference."""
        block_tables, cu_q_lens, seq_lens = rows.block_tables, rows.cu_q_lens, rows.seq_lens
        if self.kernels and q.dtype in _HALF and q.stride(-1) == 1:
            return torch.ops.lmiserve_cpu.paged_attention_prefill(
                q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale, window, softcap, self.tiles
            )
        if softcap > 0:
            return self._prefill_reference(q, k_cache, v_cache, rows, scale, window, softcap)
        out = torch.empty_like(q)
        bounds = cu_q_lens.tolist()
        block_size, kv_heads, dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
        k_flat, v_flat = k_cache.view(-1, kv_heads, dim), v_cache.view(-1, kv_heads, dim)
        for s, length in enumerate(seq_lens.tolist()):
            lo, hi = bounds[s], bounds[s + 1]
            n = hi - lo
            positions = torch.arange(length)
            slots = block_tables[s].long()[positions // block_size] * block_size + positions % block_size
            # 4-D (1, heads, tokens, dim): the layout torch's fused CPU attention takes
            k = k_flat.index_select(0, slots).transpose(0, 1).unsqueeze(0)
            v = v_flat.index_select(0, slots).transpose(0, 1).unsqueeze(0)
            qs = q[lo:hi].transpose(0, 1).unsqueeze(0)
            if n == length and window <= 0:
                o = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=scale, enable_gqa=True)
            else:
                q_pos = torch.arange(length - n, length).unsqueeze(1)
                allowed = positions.unsqueeze(0) <= q_pos
                if window > 0:
                    allowed &= positions.unsqueeze(0) > q_pos - window
                o = F.scaled_dot_product_attention(qs, k, v, attn_mask=allowed, scale=scale, enable_gqa=True)
            out[lo:hi] = o[0].transpose(0, 1)
        return out

    def _prefill_reference(self, q, k_cache, v_cache, rows: PromptRows, scale, window, softcap):  # type: ignore[no-untyped-def]
        out = torch.empty_like(q)
        bounds = rows.cu_q_lens.tolist()
        for s, length in enumerate(rows.seq_lens.tolist()):
            lo, hi = bounds[s], bounds[s + 1]
            out[lo:hi] = self._attend(q[lo:hi], k_cache, v_cache, rows.block_tables[s], length, scale, window, softcap)
        return out
